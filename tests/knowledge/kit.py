"""Helpers for the knowledge tests: a coding session driven through the gateway."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from lore_gateway.testing import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstream

# A coding agent's instructions (any length would do: knowledge/sidechannel.py).
SYSTEM = ("You are a coding agent working in a git repository. Read files before editing "
          "them, run the tests after every change, keep diffs small, explain what you "
          "changed and why, and never commit without being asked. ") * 3
TOOLS_ANTHROPIC = [{"name": "read_file", "description": "Read a file.",
                    "input_schema": {"type": "object",
                                     "properties": {"path": {"type": "string"}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "read_file", "description": "Read a file.",
                    "parameters": {"type": "object",
                                   "properties": {"path": {"type": "string"}}}}]
# What the fake agent model answers: long enough that a turn is worth distilling
# (a log not smaller than its input is discarded).
ANSWER = ("I read the deployment scripts and the CI configuration, checked which branches "
          "the release job builds from, and compared the staging and production settings. "
          "Nothing else needs to change for now; the next step is to run the test suite and "
          "look at the integration tests that cover the release pipeline. ") * 2
ANSWER_HEADER = {"x-fake-scenario": "text:" + ANSWER}


def git_project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root




class AnthropicSession:
    """One Claude-style conversation: each ``say`` resends the whole history."""

    def __init__(self, gw: Any, project: Path, session: str, key: str = ANTHROPIC_KEY) -> None:
        self.gw = gw
        self.session = session
        self.key = key
        self.system = SYSTEM + f"\nPrimary working directory: {project}"
        self.messages: list[dict[str, Any]] = []
        self.answers: list[bytes] = []

    def say(self, text: str, *, headers: dict[str, str] | None = None) -> bytes:
        self.messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
        body = {"model": "claude-fake", "max_tokens": 256, "stream": True,
                "system": self.system, "tools": TOOLS_ANTHROPIC, "messages": self.messages}
        raw = post(self.gw.url + "/v1/messages", body, {
            "x-api-key": self.key, "anthropic-version": "2023-06-01",
            "x-lore-session-id": self.session, **ANSWER_HEADER, **(headers or {})})
        self.answers.append(raw)
        reply = "".join(orjson.loads(line[6:]).get("delta", {}).get("text", "")
                        for line in raw.splitlines() if line.startswith(b"data: {")
                        and b"text_delta" in line)
        self.messages.append({"role": "assistant", "content": [{"type": "text", "text": reply}]})
        return raw


class ResponsesSession:
    """One Codex-style conversation on /v1/responses."""

    def __init__(self, gw: Any, project: Path, session: str) -> None:
        self.gw = gw
        self.session = session
        self.instructions = SYSTEM
        self.input: list[dict[str, Any]] = [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": SYSTEM}]},
            {"type": "message", "role": "user", "content": [{
                "type": "input_text",
                "text": f"<environment_context><cwd>{project}</cwd></environment_context>"}]}]

    def say(self, text: str) -> bytes:
        self.input.append({"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": text}]})
        body = {"model": "gpt-fake", "stream": True, "tools": TOOLS_RESPONSES,
                "input": self.input, "store": False}
        raw = post(self.gw.url + "/v1/responses", body, {
            "authorization": f"Bearer {OPENAI_KEY}", "session-id": self.session,
            **ANSWER_HEADER})
        self.input.append({"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": "ok"}]})
        return raw


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    """POST JSON and read the whole answer; fails on a non-200 status."""
    request = urllib.request.Request(url, data=orjson.dumps(body), method="POST",
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def worker_requests(fake: FakeUpstream, job: str | None = None) -> list[Any]:
    return [r for r in fake.model_requests if "x-lore-worker" in r.headers
            and (job is None or r.headers["x-lore-worker"] == job)]


def agent_requests(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.model_requests if "x-lore-worker" not in r.headers]


def read(gw: Any, query: Callable[[Any], Any]) -> Any:
    return gw.memory.read(query)
