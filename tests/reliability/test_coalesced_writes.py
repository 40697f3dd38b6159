"""What a response writes in one loop iteration goes out in one write, and
nothing waits longer than that iteration (``http_protocol._Coalesced``), over a
real loopback connection."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from lore_gateway.http_protocol import ConnectionLimits, _Coalesced, protocol_class
from lore_gateway.server import listen_socket


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
    out = _Coalesced(transport, asyncio.get_running_loop())
    out.write(head)  # an upstream that sends its head, then nothing for a while
    assert await _received(reader, len(head)) == head
    out.write(b"3\r\nabc\r\n")
    assert await _received(reader, 8) == b"3\r\nabc\r\n"
    out.close()
    server.close()


async def test_head_and_body_keep_their_order() -> None:
    transport, reader, server = await _pair()
    out = _Coalesced(transport, asyncio.get_running_loop())
    parts = [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n",
             b"ab", b"cd"]
    for part in parts:
        out.write(part)
    expected = b"".join(parts)
    assert await _received(reader, len(expected)) == expected
    out.close()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after the bytes
    server.close()


class _Counting:
    """A transport that counts the writes it is handed (each one a send)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.transport.write(data)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()


async def test_one_iteration_is_one_write_and_the_next_waits_for_nothing() -> None:
    transport, reader, server = await _pair()
    counting = _Counting(transport)
    out = _Coalesced(counting, asyncio.get_running_loop())
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    events, end = b"9\r\ndata: x\n\n\r\n", b"0\r\n\r\n"
    for part in (head, events, end):  # an upstream read that held the whole answer
        out.write(part)
    assert counting.writes == []
    assert await _received(reader, len(head + events + end)) == head + events + end
    assert counting.writes == [head + events + end]
    out.write(b"later")
    assert await _received(reader, 5) == b"later"
    assert counting.writes[1:] == [b"later"]
    out.close()
    server.close()


async def test_closing_sends_what_is_held_first() -> None:
    transport, reader, server = await _pair()
    out = _Coalesced(transport, asyncio.get_running_loop())
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    out.write(b"ok")
    out.close()  # in the same iteration: a response that ends the connection
    assert await asyncio.wait_for(reader.read(), 10) == (
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    server.close()


async def test_a_response_leaves_when_it_completes_not_after_the_handlers_bookkeeping() -> None:
    """The handler's work after its last write (storing the turn, metrics) runs
    in the same loop iteration; the client must not wait for it."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        time.sleep(0.5)  # noqa: ASYNC251 - bookkeeping that holds the loop, on purpose

    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        app, lifespan="off", ws="none", http=protocol_class(ConnectionLimits(30, 30, 65536, 100)),
        log_config=None, access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
        await asyncio.sleep(0.01)
    took: list[float] = []

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            start = time.monotonic()
            conn.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                got += conn.recv(65536)
            took.append(time.monotonic() - start)

    thread = threading.Thread(target=client)
    thread.start()
    await asyncio.to_thread(thread.join)
    server.should_exit = True
    await serving
    assert took and took[0] < 0.4, took
