"""The lean upstream client (``upstream.py`` on ``http1.py``) against real
loopback servers: the fake provider, a raw HTTP/1.1 server scripted byte by
byte, and an https server with a certificate made here."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson
import pytest

from lore_gateway.config import Settings
from lore_gateway.http1 import ResponseError, ResponseReader
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamDisconnected,
    UpstreamUnavailable,
)

HEADERS = [("content-type", "application/json"), ("authorization", "Bearer sk-test")]

# A scripted answer: the bytes to write, in pieces; None closes the connection.
Answer = list[bytes | None]


class RawServer:
    """Reads one request head (and a Content-Length body) at a time and writes
    the next scripted answer; counts connections and records requests."""

    def __init__(self, answer: Callable[[int], Answer]) -> None:
        self._answer = answer
        self.connections = 0
        self.closed_by_peer = asyncio.Event()
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                for piece in self._answer(len(self.requests)):
                    if piece is None:
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_peer.set()
        finally:
            writer.close()


def _chunked(*parts: bytes, headers: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n" + headers + b"\r\n" + body


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[UpstreamClient]:
    upstream = UpstreamClient(Settings(data_dir=tmp_path, upstream_read_timeout=1.0))
    await upstream.start()
    yield upstream
    await upstream.close()


async def test_streams_a_fake_provider_answer_with_the_requests_headers(
        client: UpstreamClient) -> None:
    fake = FakeUpstream()
    await fake.start()
    try:
        body = orjson.dumps({"model": "gpt-fake", "stream": True, "input": "hi"})
        resp = await client.send("POST", fake.url + "/v1/responses", HEADERS, body)
        assert resp.status == 200
        assert resp.content_type.startswith("text/event-stream")
        streamed = b"".join([chunk async for chunk in resp.chunks()])
        resp.close()
        assert b"event: response.completed" in streamed
        received = fake.model_requests[-1]
        assert received.body == body
        assert received.headers["authorization"] == "Bearer sk-test"
        assert received.headers["content-length"] == str(len(body))
        assert received.headers["accept-encoding"] == "gzip, deflate"
    finally:
        await fake.stop()


async def test_keeps_one_connection_alive_across_requests(client: UpstreamClient) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    async with RawServer(lambda n: [answer]) as server:
        for _ in range(3):
            resp = await client.send("POST", server.url + "/v1/x?a=b", HEADERS, b"{}")
            assert await resp.read(100) == (b"ok", False)
            resp.close()
        assert server.connections == 1
        assert server.requests[0].startswith(b"POST /v1/x?a=b HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}".encode() in server.requests[0]


async def test_an_idle_connection_is_closed_after_a_while(tmp_path: Path) -> None:
    client = UpstreamClient(Settings(data_dir=tmp_path), idle_seconds=0.05)
    await client.start()
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    try:
        async with RawServer(lambda n: [answer]) as server:
            resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
            assert await resp.read(100) == (b"ok", False)
            await asyncio.wait_for(server.closed_by_peer.wait(), 10)
            resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
            assert await resp.read(100) == (b"ok", False)
            assert server.connections == 2
    finally:
        await client.close()


@pytest.mark.parametrize("encoding, encode", [
    (b"gzip", gzip.compress),
    (b"deflate", zlib.compress),
    (b"deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
])
async def test_decodes_compressed_chunked_bodies(
        client: UpstreamClient, encoding: bytes, encode: Callable[[bytes], bytes]) -> None:
    text = b"data: " + b"x" * 5000 + b"\n\n"
    packed = encode(text)
    answer = _chunked(packed[:7], packed[7:], headers=b"content-encoding: " + encoding + b"\r\n")
    async with RawServer(lambda n: [answer[:40], answer[40:]]) as server:
        resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
        assert await resp.read(1 << 20) == (text, False)
        resp.close()


async def test_a_body_framed_by_the_close_ends_there(client: UpstreamClient) -> None:
    async with RawServer(lambda n: [b"HTTP/1.1 200 OK\r\n\r\nall of it", None]) as server:
        resp = await client.send("GET", server.url + "/v1/models", HEADERS, None)
        assert await resp.read(100) == (b"all of it", False)
        resp.close()
        assert b"content-length" not in server.requests[0].lower()


async def test_a_connection_closed_before_any_answer_is_a_disconnect(
        client: UpstreamClient) -> None:
    async with RawServer(lambda n: [None]) as server:
        with pytest.raises(UpstreamDisconnected, match="closed the connection"):
            await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")


async def test_a_body_cut_short_breaks_the_read(client: UpstreamClient) -> None:
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this"
    async with RawServer(lambda n: [cut, None]) as server:
        resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
        got = b""
        with pytest.raises(UpstreamBroken, match="before the response was complete"):
            async for chunk in resp.chunks():
                got += chunk
        assert got == b"only this"
        resp.close()


async def test_a_stalled_body_times_out(tmp_path: Path) -> None:
    client = UpstreamClient(Settings(data_dir=tmp_path, upstream_read_timeout=0.2))
    await client.start()
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"

    def answer(n: int) -> Answer:
        return [head]

    try:
        async with RawServer(answer) as server:
            resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
            chunks = resp.chunks()
            assert await anext(chunks) == b"first"
            with pytest.raises(UpstreamBroken, match="TimeoutError"):
                await anext(chunks)
            resp.close()
            await asyncio.wait_for(server.closed_by_peer.wait(), 10)
    finally:
        await client.close()


async def test_closing_an_unfinished_body_closes_the_connection(client: UpstreamClient) -> None:
    endless = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"5\r\nchunk\r\n" * 3
    async with RawServer(lambda n: [endless]) as server:
        resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
        assert (await anext(resp.chunks())).startswith(b"chunk")
        resp.close()
        # The server reads the close as the client gone (upstream cancellation).
        await asyncio.wait_for(server.closed_by_peer.wait(), 10)
        resp = await client.send("POST", server.url + "/v1/x", HEADERS, b"{}")
        resp.close()
        assert server.connections == 2


async def test_an_unreachable_upstream_is_unavailable(client: UpstreamClient) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(UpstreamUnavailable, match=f"cannot connect to 127.0.0.1:{port}"):
        await client.send("POST", f"http://127.0.0.1:{port}/v1/x", HEADERS, b"{}")


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


async def test_https_upstreams_are_verified(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    answer = _chunked(b"secure ", b"hello")

    served = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)
                writer.write(answer)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            writer.close()
            served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://localhost:{server.sockets[0].getsockname()[1]}/v1/x"
    trusted = UpstreamClient(Settings(data_dir=tmp_path),
                             ssl_context=ssl.create_default_context(cafile=str(cert)))
    default = UpstreamClient(Settings(data_dir=tmp_path))
    await trusted.start()
    await default.start()
    try:
        for _ in range(2):
            resp = await trusted.send("POST", url, HEADERS, b"{}")
            assert await resp.read(100) == (b"secure hello", False)
            resp.close()
        with pytest.raises(UpstreamUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await default.send("POST", url, HEADERS, b"{}")
        await trusted.close()
        await asyncio.wait_for(served.wait(), 10)  # the server saw the pooled connection end
    finally:
        await trusted.close()
        await default.close()
        server.close()


def test_the_reader_parses_a_response_fed_byte_by_byte() -> None:
    data = _chunked(b"one", b"two", headers=b"x-request-id: r1\r\n")
    reader = ResponseReader()
    for i in range(len(data)):
        reader.feed(data[i:i + 1])
    assert (reader.status, reader.complete, reader.keep_alive) == (200, True, True)
    assert (b"x-request-id", b"r1") in reader.raw_headers
    assert reader.take() == b"onetwo"


def test_the_reader_refuses_a_corrupt_gzip_body_and_garbage() -> None:
    reader = ResponseReader()
    with pytest.raises(ResponseError, match="corrupt"):
        reader.feed(_chunked(b"not gzip at all", headers=b"content-encoding: gzip\r\n"))
    with pytest.raises(ResponseError, match="invalid HTTP response"):
        ResponseReader().feed(b"SSH-2.0-OpenSSH\r\n\r\n")
