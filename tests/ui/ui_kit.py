"""Helpers of the /ui browser tests: a gateway with traffic, turns through the SDK."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import openai

from lore_gateway.testing import BackgroundServer, FakeUpstream, gateway_settings

FACT = "The staging database password rotation happens every Tuesday at 04:00 UTC."
RECALL_QUERY = "staging database password rotation"
TOOLS = [{"type": "function", "name": "exec",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def git_project(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def start_gateway(fake: FakeUpstream, data_dir: Path, **overrides: Any) -> BackgroundServer[Any]:
    from lore_gateway.server import Gateway

    settings = gateway_settings(fake, data_dir, ui_sample_seconds=0.2, **overrides)
    runner: BackgroundServer[Any] = BackgroundServer(Gateway(settings), name="ui-gateway")
    runner.start()
    return runner


def sdk(gw: Any, session: str, project: Path, *, scenario: str | None = None,
        key: str | None = None) -> openai.OpenAI:
    headers = {"x-lore-session-id": session, "x-lore-project": str(project)}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    if key is not None:
        headers["x-lore-key"] = key
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-ui-test-0123456789",
                         max_retries=0, default_headers=headers)


def wait_turns(gw: Any, session: str, turns: int) -> None:
    """Until ``session`` has ``turns`` stored turns (storage runs after delivery)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        if gw.memory.count_turns(None, session=session) >= turns:
            return
        time.sleep(0.02)
    raise AssertionError(f"session {session} never reached {turns} stored turns")


def say(gw: Any, session: str, project: Path, text: str, *, key: str | None = None,
        scenario: str | None = None) -> str:
    """One turn through the gateway; the answer's text."""
    answer = sdk(gw, session, project, scenario=scenario, key=key).responses.create(
        model="gpt-fake", input=text, tools=TOOLS)  # type: ignore[arg-type]
    return str(answer.output_text)
