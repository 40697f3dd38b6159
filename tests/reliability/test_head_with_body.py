"""The response head waits at most one loop iteration for the first body bytes
(``http_protocol._HeadWithBody``), over a real loopback connection."""

from __future__ import annotations

import asyncio

from lore_gateway.http_protocol import _HeadWithBody


async def _pair() -> tuple[asyncio.Transport, asyncio.StreamReader, asyncio.Server]:
    accepted: asyncio.Future[asyncio.StreamReader] = asyncio.get_running_loop().create_future()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(reader)

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await asyncio.get_running_loop().create_connection(
        asyncio.Protocol, "127.0.0.1", port)
    return transport, await accepted, server  # type: ignore[return-value]


async def _received(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), 10)


async def test_a_head_alone_still_reaches_the_client() -> None:
    transport, reader, server = await _pair()
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    out = _HeadWithBody(transport, asyncio.get_running_loop())
    out.write(head)  # an upstream that sends its head, then nothing for a while
    assert await _received(reader, len(head)) == head
    out.write(b"3\r\nabc\r\n")
    assert await _received(reader, 8) == b"3\r\nabc\r\n"
    out.close()
    server.close()


async def test_head_and_body_keep_their_order() -> None:
    transport, reader, server = await _pair()
    out = _HeadWithBody(transport, asyncio.get_running_loop())
    parts = [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n",
             b"ab", b"cd"]
    for part in parts:
        out.write(part)
    expected = b"".join(parts)
    assert await _received(reader, len(expected)) == expected
    out.close()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the bytes
    server.close()
