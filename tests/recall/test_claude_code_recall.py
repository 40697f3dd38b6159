"""Claude Code and hidden recall (issue 5).

First a captured Claude Code request replayed through the gateway: everything
Claude Code-specific passes through untouched and the recall injection is the
only change upstream. Then the real ``claude -p`` binary, offline against the
fake, across two runs in the same project: the second run's model recalls what
the first run was told, and Claude Code prints an answer built from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lore_gateway.testing import FakeUpstream, wait_until_stored

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
from agent_cli import CLAUDE_BIN, agent_binary, base_env, claude_print, run

CAPTURED = "claude-code/captured-requests/messages_turn1_request.json"
API_KEY = "sk-ant-test-claude-recall-0123456789"
FACT = "The billing service deploys from the tangerine branch."
QUERY = "billing service deploy branch"
# Request headers the replay keeps (the rest are transport details of the capture).
KEPT_HEADERS = ("anthropic-beta", "anthropic-version", "x-app", "user-agent",
                "x-claude-code-session-id", "content-type")


def captured(fixtures_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((fixtures_dir / CAPTURED).read_text())
    return data


def cache_breakpoints(value: Any) -> int:
    if isinstance(value, dict):
        return ("cache_control" in value) + sum(cache_breakpoints(v) for v in value.values())
    if isinstance(value, list):
        return sum(cache_breakpoints(v) for v in value)
    return 0


@pytest.mark.parametrize("auth", ["x-api-key", "bearer"])
async def test_captured_request_passes_through_with_only_the_recall_tool_added(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        fixtures_dir: Path, auth: str) -> None:
    capture = captured(fixtures_dir)
    headers = {k: v for k, v in capture["headers"].items() if k.lower() in KEPT_HEADERS}
    if auth == "x-api-key":
        headers["x-api-key"] = API_KEY
    else:
        headers["authorization"] = "Bearer " + API_KEY
    body = capture["body"]
    async with http.post(gateway.url + capture["path"], data=json.dumps(body).encode(),
                         headers=headers) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw.count(b"event: message_stop") == 1

    (upstream,) = fake_upstream.model_requests
    assert upstream.path == "/v1/messages?beta=true"
    if auth == "x-api-key":
        assert upstream.headers["x-api-key"] == API_KEY
    else:
        assert upstream.headers["authorization"] == "Bearer " + API_KEY
    for name in ("anthropic-beta", "anthropic-version", "x-claude-code-session-id"):
        assert upstream.headers[name] == headers[next(k for k in headers if k.lower() == name)]
    sent = upstream.json
    # The only differences: recall appended to the tools, parallel tool use off.
    assert sent["tools"][:-1] == body["tools"]
    assert sent["tools"][-1]["name"] == "recall"
    assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    rest = {k: v for k, v in sent.items() if k not in ("tools", "tool_choice")}
    assert rest == {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    assert [m["role"] for m in sent["messages"]] == ["user", "system"]
    assert sent["thinking"] == {"type": "adaptive"}
    assert sent["context_management"] == body["context_management"]
    assert cache_breakpoints(sent) == cache_breakpoints(body) <= 4


async def test_head_probe_passes_through(gateway: Any, fake_upstream: FakeUpstream,
                                         http: aiohttp.ClientSession) -> None:
    async with http.head(gateway.url + "/") as resp:
        assert resp.status == 200


# --- the real binary -------------------------------------------------------------




@pytest.mark.clients
def test_claude_code_recalls_a_fact_from_an_earlier_run(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw = make_gateway()
    env = {"ANTHROPIC_API_KEY": API_KEY}
    first = claude_print(claude, tmp_path, gw.url, f"Remember this: {FACT}", extra_env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    wait_until_stored(gw, FACT)
    fake_upstream.reset()

    second = claude_print(claude, tmp_path, gw.url, "Which branch does billing deploy from?",
                          extra_env=env | {
                              "ANTHROPIC_CUSTOM_HEADERS": f"x-fake-scenario: recall:{QUERY}"})
    assert second.returncode == 0, second.stderr[-3000:]
    assert FACT in second.stdout, second.stdout
    assert "According to memory" in second.stdout
    turns = [r for r in fake_upstream.model_requests if r.route == "/v1/messages"]
    assert all(b"No such tool available" not in r.body for r in turns)
    follow_ups = [r for r in turns if r.json["messages"][-1]["role"] == "user"
                  and any(b.get("type") == "tool_result" and FACT in str(b.get("content"))
                          for b in r.json["messages"][-1]["content"]
                          if isinstance(b, dict))]
    assert follow_ups, "no follow-up carried the recalled fact"
    assert any(t["name"] == "recall" for t in follow_ups[0].json["tools"])

    # The next turn of that conversation (claude -c): Claude Code sends back the
    # marker message; upstream gets the follow-up's exact pair in its place.
    pair = follow_ups[-1].json["messages"][-2:]
    fake_upstream.reset()
    env |= {"ANTHROPIC_BASE_URL": gw.url, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1"}
    third = run([str(claude), "-c", "-p", "thanks"], base_env(tmp_path / "home") | env,
                tmp_path / "work")
    assert third.returncode == 0, third.stderr[-3000:]
    history = fake_upstream.model_requests[-1].json["messages"]
    assert any(history[i:i + 2] == pair for i in range(len(history) - 1))
    assert "lore-recall:" not in json.dumps(history)
