"""The follow-up's stream flag and its consumer never diverge (lore-spec C.1).

A real aiohttp server on 127.0.0.1 plays the upstream; each test picks what it
answers and records the body the follow-up sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from lore_gateway.config import Settings
from lore_gateway.recall.core.followup import (
    FollowUpError,
    JSONFollowUp,
    StreamedFollowUp,
    send_follow_up,
)
from lore_gateway.upstream import UpstreamClient

SSE_BODY = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"r"}}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r"}}\n\n'
)


class Upstream:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer: tuple[int, str | None, bytes] = (200, "application/json", b"{}")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(orjson.loads(await request.read()))
        status, content_type, body = self.answer
        resp = web.StreamResponse(status=status)
        if content_type is not None:
            resp.content_type = content_type
        else:
            resp.headers["Content-Type"] = ""
        await resp.prepare(request)
        # Two writes, so the sniffing path sees a body that arrives in pieces.
        await resp.write(body[:3])
        await resp.write(body[3:])
        await resp.write_eof()
        return resp


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, str, UpstreamClient]]:
    fake = Upstream()
    app = web.Application()
    app.router.add_post("/v1/responses", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = UpstreamClient(Settings())
    await client.start()
    yield fake, f"http://127.0.0.1:{port}/v1/responses", client
    await client.close()
    await runner.cleanup()


HEADERS = [("content-type", "application/json")]


async def test_stream_true_reads_sse_and_sends_stream_true(upstream: Any) -> None:
    fake, url, client = upstream
    fake.answer = (200, "text/event-stream", SSE_BODY)
    result = await send_follow_up(
        client, url, HEADERS, {"model": "m", "stream": False}, stream=True
    )
    assert isinstance(result, StreamedFollowUp)
    names = [e.name async for e in result.events if e.has_data]
    result.close()
    assert names == ["response.created", "response.completed"]
    assert fake.bodies[-1]["stream"] is True


async def test_stream_true_sniffs_sse_without_content_type(upstream: Any) -> None:
    fake, url, client = upstream
    fake.answer = (200, None, SSE_BODY)
    result = await send_follow_up(client, url, HEADERS, {"model": "m"}, stream=True)
    assert isinstance(result, StreamedFollowUp)
    raw = b"".join([e.raw async for e in result.events])
    result.close()
    assert raw == SSE_BODY


async def test_stream_true_refuses_a_json_body(upstream: Any) -> None:
    fake, url, client = upstream
    fake.answer = (200, "application/json", b'{"id":"resp_1","output":[]}')
    with pytest.raises(FollowUpError) as info:
        await send_follow_up(client, url, HEADERS, {"model": "m"}, stream=True)
    assert str(info.value) == (
        'recall follow-up expected SSE but got "application/json" and a non-SSE body'
    )


async def test_stream_false_parses_json_and_sends_stream_false(upstream: Any) -> None:
    fake, url, client = upstream
    fake.answer = (200, "application/json", b'{"id":"resp_1","output":[]}')
    result = await send_follow_up(
        client, url, HEADERS, {"model": "m", "stream": True}, stream=False
    )
    assert result == JSONFollowUp({"id": "resp_1", "output": []})
    assert fake.bodies[-1]["stream"] is False


@pytest.mark.parametrize("content_type", ["text/event-stream", None, "application/json"])
async def test_stream_false_refuses_sse(upstream: Any, content_type: str | None) -> None:
    fake, url, client = upstream
    fake.answer = (200, content_type, SSE_BODY)
    with pytest.raises(FollowUpError) as info:
        await send_follow_up(client, url, HEADERS, {"model": "m"}, stream=False)
    assert str(info.value) == (
        "recall follow-up expected JSON but got SSE — stream flag/consumer mismatch"
    )


async def test_non_2xx_is_follow_up_failed(upstream: Any) -> None:
    fake, url, client = upstream
    fake.answer = (400, "application/json", b'{"detail":"Stream must be set to true"}')
    with pytest.raises(FollowUpError) as info:
        await send_follow_up(client, url, HEADERS, {"model": "m"}, stream=False)
    assert info.value.category == "follow_up_failed" and info.value.status == 400


async def test_unreachable_upstream_is_a_transport_failure() -> None:
    client = UpstreamClient(Settings())
    await client.start()
    try:
        with pytest.raises(FollowUpError) as info:
            await send_follow_up(
                client, "http://127.0.0.1:9/v1/responses", HEADERS, {}, stream=True
            )
    finally:
        await client.close()
    assert info.value.category == "follow_up_transport"
