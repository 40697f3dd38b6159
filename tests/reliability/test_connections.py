"""Connection hygiene (issue 10, point 6): nothing a client leaves unfinished holds
a connection for ever, and nothing oversized reaches the parser."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lore_gateway.testing import FakeUpstream

# Short deadlines so each test waits for the gateway's own timer, not a sleep.
LIMITS = {"header_timeout": 0.5, "body_timeout": 0.5, "max_header_bytes": 16 * 1024,
          "max_connections": 4}


async def connect(gw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = gw.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the gateway sends before it closes the connection."""
    return await asyncio.wait_for(reader.read(), 30)


@pytest.fixture
def gw(make_gateway: Any) -> Any:
    return make_gateway(**LIMITS)


async def test_a_connection_that_never_sends_a_request_is_closed(gw: Any) -> None:
    reader, writer = await connect(gw)
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_headers_that_never_finish_get_a_408(gw: Any, fake_upstream: FakeUpstream) -> None:
    reader, writer = await connect(gw)
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 408")
    assert b"LORE_HEADER_TIMEOUT" in reply
    assert fake_upstream.requests == []
    writer.close()


async def test_a_body_that_never_finishes_gets_a_408(gw: Any, fake_upstream: FakeUpstream) -> None:
    reader, writer = await connect(gw)
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"model\":")
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 408")
    assert b"LORE_BODY_TIMEOUT" in reply
    assert fake_upstream.requests == []
    writer.close()


async def test_an_oversized_header_block_gets_a_431_before_it_is_parsed(gw: Any) -> None:
    reader, writer = await connect(gw)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 * 1024))
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 431")
    assert b"LORE_MAX_HEADER_BYTES" in reply
    writer.close()


async def test_a_huge_header_is_cut_off_and_the_gateway_keeps_serving(gw: Any) -> None:
    reader, writer = await connect(gw)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 * 1024 * 1024))
    try:
        reply = await until_closed(reader)
    except (ConnectionResetError, BrokenPipeError):  # closed with our bytes still
        # unread or unsent (reset on the read side, or on the write still flushing
        # the 8 MiB): also refused
        reply = b"HTTP/1.1 431"
    assert reply.startswith(b"HTTP/1.1 431")
    writer.close()
    reader, writer = await connect(gw)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await until_closed(reader)).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_a_header_block_under_the_limit_is_served(gw: Any) -> None:
    reader, writer = await connect(gw)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 * 1024)
                 + b"\r\nConnection: close\r\n\r\n")
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 200")
    writer.close()


async def test_connections_beyond_the_limit_get_a_clear_503(gw: Any) -> None:
    held = [await connect(gw) for _ in range(LIMITS["max_connections"])]
    # Each held connection is known to the server once it answers a request.
    for reader, writer in held:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"}")
    reader, writer = await connect(gw)
    reply = await until_closed(reader)
    assert reply.startswith(b"HTTP/1.1 503")
    assert b"LORE_MAX_CONNECTIONS" in reply
    writer.close()
    for _, w in held:
        w.close()
