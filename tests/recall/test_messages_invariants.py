"""Recall coverage stays private on Anthropic and Chat too (issue 9 §8).

Every byte the client received (body and headers, streamed and JSON) is searched
for what only the recall knows: the tool result the follow-up carried upstream,
the references in it, and the executor's private coverage fingerprints. The
fake's continuation is a fixed text, so none of it may appear.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from responses_rig import private_coverage_marks, wait_stored

from lore_gateway.testing import FakeUpstream

KEY = "sk-messages-invariants-0123456789"
FACT = "The quartz mirror syncs its package index every Monday at 02:00 UTC."
QUERY = "quartz mirror sync"
ANTHROPIC_TOOLS: Any = [{"name": "read_file", "description": "Read a file.",
                         "input_schema": {"type": "object", "properties": {}}}]
CHAT_TOOLS: Any = [{"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object", "properties": {}}}}]


def _request(protocol: str, text: str, stream: bool, session: str,
             scenario: str | None = None) -> tuple[str, dict[str, Any], dict[str, str]]:
    headers = {"x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    if protocol == "anthropic":
        headers.update({"x-api-key": KEY, "anthropic-version": "2023-06-01"})
        return "/v1/messages", {"model": "claude-fake", "max_tokens": 256, "stream": stream,
                                "tools": ANTHROPIC_TOOLS,
                                "messages": [{"role": "user", "content": text}]}, headers
    headers["authorization"] = f"Bearer {KEY}"
    return "/v1/chat/completions", {"model": "gpt-fake", "stream": stream, "tools": CHAT_TOOLS,
                                    "messages": [{"role": "user", "content": text}]}, headers


async def _post(http: aiohttp.ClientSession, gw: Any, protocol: str, text: str, stream: bool,
                session: str, scenario: str | None = None) -> tuple[int, bytes]:
    path, body, headers = _request(protocol, text, stream, session, scenario)
    async with http.post(gw.url + path, json=body, headers=headers) as resp:
        raw = await resp.read()
        head = "\n".join(f"{k}: {v}" for k, v in resp.headers.items()).encode()
        return resp.status, raw + b"\n" + head


def _tool_result(protocol: str, follow_up: dict[str, Any]) -> str:
    last = follow_up["messages"][-1]
    if protocol == "anthropic":
        return str(last["content"][0]["content"])
    return str(last["content"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
async def test_client_bytes_hold_no_recall_result_or_coverage(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
        protocol: str, stream: bool) -> None:
    seed_session = f"priv-seed-{protocol}-{stream}"
    status, _ = await _post(http, gateway, protocol, f"{FACT} Remember it.", False,
                            seed_session)
    assert status == 200
    wait_stored(gateway, seed_session)
    fake_upstream.script([f"recall:{QUERY}", "text:Done, the mirror syncs weekly"])
    status, seen = await _post(http, gateway, protocol, "When does the quartz mirror sync?",
                               stream, f"priv-{protocol}-{stream}")
    assert status == 200
    follow_up = fake_upstream.model_requests[-1]
    result = _tool_result(protocol, follow_up.json)
    refs = re.findall(r"\((t:[^)\s]+)\)", result)
    assert refs and FACT[:40] in result  # the recall really found the fact
    assert b"weekly" in seen  # the answer did arrive
    assert result.encode() not in seen
    for line in result.splitlines():
        if line.strip() and line.strip() != "---":
            assert line.encode() not in seen, line
    for ref in refs:
        assert ref.encode() not in seen, "a recall reference reached the client"
    marks = private_coverage_marks(gateway)
    assert marks
    for mark in marks:
        assert mark not in seen, "private recall coverage reached the client"
