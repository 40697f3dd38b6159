"""Errors that say why (issue 15 point 8): a broken or disconnecting upstream
reaches the client as its protocol's error, with the reason and no credential."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from lore_gateway.testing import OPENAI_KEY, FakeUpstream

TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object"}}
CHAT_TOOL = {"type": "function", "function": {"name": "read_file",
                                              "parameters": {"type": "object"}}}
ANTHROPIC_TOOL = {"name": "read_file", "input_schema": {"type": "object"}}
CASES = {
    "responses": ("/v1/responses", {"model": "gpt-x", "input": "hi", "tools": [TOOL]}),
    "chat": ("/v1/chat/completions", {"model": "gpt-x", "tools": [CHAT_TOOL],
                                      "messages": [{"role": "user", "content": "hi"}]}),
    "anthropic": ("/v1/messages", {"model": "claude-x", "max_tokens": 20, "tools": [ANTHROPIC_TOOL],
                                   "messages": [{"role": "user", "content": "hi"}]}),
}


async def stream(http: aiohttp.ClientSession, gw: Any, case: str, scenario: str,
                 *, tool: bool) -> tuple[int, bytes]:
    path, body = CASES[case]
    if not tool:
        body = {k: v for k, v in body.items() if k != "tools"}
    headers = {"authorization": f"Bearer {OPENAI_KEY}", "x-api-key": OPENAI_KEY,
               "anthropic-version": "2023-06-01", "x-fake-scenario": scenario}
    async with http.post(gw.url + path, json={**body, "stream": True},
                         headers=headers) as response:
        try:
            return response.status, await response.read()
        except aiohttp.ClientPayloadError:
            return response.status, b"<aborted>"


def error_message(body: bytes) -> str:
    last = body.rstrip().rsplit(b"\n\n", 1)[-1]
    data = orjson.loads(last.split(b"data: ", 1)[1])
    if "response" in data:
        return str(data["response"]["error"]["message"])
    return str(data["error"]["message"])


# The recall handlers write their own failure events (recall/**, being rebuilt
# as one chain machine in parallel): they must carry the reason too. Strict, so
# the marks go the moment the rebuilt machine says why.
@pytest.mark.parametrize("case,tool", [
    *[pytest.param(case, False, id=f"{case}-plain") for case in sorted(CASES)],
    pytest.param("anthropic", True, id="anthropic-recall"),
    pytest.param("chat", True, id="chat-recall"),
    pytest.param("responses", True, id="responses-recall"),
])
async def test_an_upstream_that_disconnects_mid_answer_is_reported_as_such(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream,
    case: str, tool: bool,
) -> None:
    status, body = await stream(http, gateway, case, "reset-mid-stream", tool=tool)
    assert status == 200
    message = error_message(body)
    assert "upstream connection broke mid-response" in message, message
    assert "Connection reset" in message or "payload" in message.lower(), message
    assert OPENAI_KEY not in body.decode()


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_malformed_upstream_frame_in_recall_mode_says_which_event(
    gateway: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream, case: str,
) -> None:
    _, body = await stream(http, gateway, case, "malformed-event", tool=True)
    message = error_message(body)
    assert "malformed" in message.lower(), message
    assert OPENAI_KEY not in body.decode()


async def test_an_upstream_that_hangs_up_before_answering_is_not_called_unreachable(
    make_gateway: Any, http: aiohttp.ClientSession,
) -> None:
    async def hang_up(reader: Any, writer: Any) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gw = make_gateway(upstream_openai=f"http://127.0.0.1:{port}")
    try:
        async with http.post(gw.url + "/v1/responses", json={"model": "m", "input": "hi"},
                             headers={"authorization": f"Bearer {OPENAI_KEY}"}) as response:
            assert response.status == 502
            message = orjson.loads(await response.read())["error"]["message"]
    finally:
        server.close()
    assert "closed the connection before answering" in message
    assert "Could not reach" not in message
