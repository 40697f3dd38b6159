"""What a client sees when the upstream breaks in the middle of a response."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from lore_gateway.delivery import BROKEN_STREAM_MESSAGE
from lore_gateway.testing import FakeUpstream

REQUESTS = {
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "stream": True},
                  b"event: response.failed\n"),
    "chat": ("/v1/chat/completions",
             {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
             b'data: {"error":'),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 10, "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]},
                  b"event: error\n"),
}


@pytest.mark.parametrize("shape", sorted(REQUESTS))
async def test_break_between_events_ends_with_one_protocol_error_event(
    shape: str, gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    path, body, error_start = REQUESTS[shape]
    headers = {"x-fake-scenario": "reset-mid-stream:2", "anthropic-version": "2023-06-01"}
    async with http.post(gateway.url + path, json=body, headers=headers) as response:
        received = await response.read()  # ends cleanly: no ClientPayloadError
    frames = [f for f in received.split(b"\n\n") if f]
    assert len(frames) == 3  # the two upstream frames, then the gateway's error event
    assert frames[2].startswith(error_start)
    assert BROKEN_STREAM_MESSAGE.encode() in frames[2]


def test_openai_sdk_sees_response_failed(openai_client: Any, fake_upstream: FakeUpstream) -> None:
    fake_upstream.script(["reset-mid-stream:3"])
    events = [e.type for e in openai_client.responses.create(model="m", input="hi", stream=True)]
    assert events[-1] == "response.failed"
    assert events[:3] == ["response.created", "response.in_progress",
                          "response.output_item.added"]


def test_chat_and_anthropic_sdks_raise_with_the_gateway_message(
    openai_client: Any, anthropic_client: Any, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.script(["reset-mid-stream:2", "reset-mid-stream:2"])
    with pytest.raises(openai.APIError, match="broke mid-response"):
        for _ in openai_client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
            pass
    with pytest.raises(anthropic.APIStatusError, match="broke mid-response"):
        for _ in anthropic_client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                stream=True):
            pass


async def test_break_inside_an_event_aborts_the_client_connection(
    make_gateway: Any, http: aiohttp.ClientSession
) -> None:
    """Half an event cannot be completed honestly: the client sees a truncated body."""

    async def half_an_event(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        part = b'event: response.created\ndata: {"type":"response.cre'
        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    server = await asyncio.start_server(half_an_event, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gw = make_gateway(upstream_openai=f"http://127.0.0.1:{port}", store=False)
        path, body, _ = REQUESTS["responses"]
        async with http.post(gw.url + path, json=body) as response:
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
    finally:
        server.close()
