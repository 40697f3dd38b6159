"""The upstream client layer: pooled HTTP/1.1 connections to the providers.

This layer knows nothing of protocols: it sends bytes and hands back a response
whose body can be read whole (bounded) or chunk by chunk as it arrives. It is
the asyncio shell around :mod:`lore_gateway.http1` (the request's bytes, the
response's parsing): one ``asyncio.Protocol`` per connection, kept alive and
pooled per origin, TLS with the default context for ``https`` upstreams, a
connect and a read timeout, gzip and deflate bodies decoded.

It replaced aiohttp's ``ClientSession`` (issue 14, fourth round), which did
much more per request than the gateway needs (redirects, cookies, proxies,
multipart, a task per request body): 15-20% of the event loop's samples.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from lore_gateway import __version__
from lore_gateway.config import Settings
from lore_gateway.http1 import RawHeaders, ResponseError, ResponseReader, encode_request
from lore_gateway.routing import Upstream

# Connections in use at once, over all upstreams; a request beyond waits for one.
MAX_CONNECTIONS = 512
# Idle keep-alive connections kept per origin (more are closed when released).
MAX_IDLE_PER_ORIGIN = 64
# An idle connection is closed after this long: providers drop theirs after
# about a minute, and reusing one they are closing fails the request.
IDLE_SECONDS = 15.0
# Decoded body bytes buffered before the socket stops being read (backpressure:
# a slow client slows the upstream instead of growing this buffer).
MAX_BUFFERED_BODY = 256 * 1024

USER_AGENT = f"lore-gateway/{__version__}"


class UpstreamUnavailable(Exception):
    """The upstream could not be reached, or the connection failed before a response."""


class UpstreamDisconnected(UpstreamUnavailable):
    """The upstream accepted the connection, then closed it before any response."""


class UpstreamBroken(Exception):
    """The upstream connection failed while the response body was being read."""


class _Connection(asyncio.Protocol):
    """One connection to an origin: feeds what it reads to the current
    response's reader and wakes whoever waits for it."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        self.error: BaseException | None = None  # why the connection ended, when it did
        self.closed = False
        self.paused = False
        self.idle_since = 0.0  # loop time it was pooled
        self._waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:  # bytes nobody asked for: this connection cannot be reused
            self.close()
            return
        try:
            reader.feed(data)
        except ResponseError as exc:
            self.error = exc
            self.close()
        else:
            if reader.buffered > MAX_BUFFERED_BODY and not self.paused and self.transport:
                self.paused = True
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        if self.reader is not None:
            try:
                self.reader.feed_eof()
            except ResponseError as exc:
                self.error = exc
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.error is None:
            if exc is not None:
                self.error = exc
            elif self.reader is not None and not self.reader.complete:
                try:
                    self.reader.feed_eof()
                except ResponseError as eof:
                    self.error = eof
        self._wake()

    # --- for the response -------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seconds: float) -> None:
        """Until something was read (or the connection ended), at most ``seconds``
        seconds: then ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(seconds, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no data from the upstream within the read timeout"))


class UpstreamResponse:
    """A response whose headers have arrived; the body is read on demand."""

    __slots__ = ("_client", "_conn", "_done", "content_type", "raw_headers", "status")

    def __init__(self, client: UpstreamClient, conn: _Connection, reader: ResponseReader) -> None:
        self._client = client
        self._conn = conn
        self._done = False
        self.status = reader.status
        self.raw_headers: RawHeaders = reader.raw_headers
        self.content_type = ""
        for name, value in reader.raw_headers:
            if name.lower() == b"content-type":
                self.content_type = value.decode("latin-1")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (already decoded from any Content-Encoding)."""
        conn = self._conn
        reader = conn.reader
        assert reader is not None and not self._done, "the body was already read or closed"
        timeout = self._client.read_timeout
        while True:
            if reader.body:
                data = reader.take()
                conn.resume()
                yield data
                continue
            if reader.complete:
                self._release()
                return
            if conn.error is not None or conn.closed:
                raise UpstreamBroken(_describe(conn.error or ConnectionResetError(
                    "the upstream closed the connection")))
            try:
                await conn.wait(timeout)
            except TimeoutError as exc:
                raise UpstreamBroken(_describe(exc)) from exc

    async def read(self, limit: int) -> tuple[bytes, bool]:
        """The body, at most ``limit`` bytes; the flag says whether it was cut."""
        buf = bytearray()
        async for chunk in self.chunks():
            buf += chunk
            if len(buf) > limit:
                del buf[limit:]
                return bytes(buf), True
        return bytes(buf), False

    def close(self) -> None:
        """Release the connection; an unfinished body closes it (cancels upstream)."""
        if self._done:
            return
        reader = self._conn.reader
        if reader is not None and reader.complete:  # all of it arrived: the connection is reusable
            self._release()
            return
        self._done = True
        self._conn.close()
        self._client._checked_in(self._conn, reuse=False)

    def _release(self) -> None:
        if not self._done:
            self._done = True
            reader = self._conn.reader
            self._client._checked_in(self._conn, reuse=reader is not None and reader.keep_alive)


class UpstreamClient:
    """Sends requests to the configured upstream base URLs."""

    def __init__(self, settings: Settings, *, ssl_context: ssl.SSLContext | None = None,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self._bases = {
            Upstream.OPENAI: settings.upstream_openai,
            Upstream.CHATGPT: settings.upstream_chatgpt,
            Upstream.ANTHROPIC: settings.upstream_anthropic,
            Upstream.GEMINI: settings.upstream_gemini,
        }
        self.connect_timeout = settings.upstream_connect_timeout
        self.read_timeout = settings.upstream_read_timeout
        self._ssl_context = ssl_context
        self._idle_seconds = idle_seconds
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._slots: asyncio.Semaphore | None = None
        self._origins: dict[str, tuple[tuple[str, str, int], str, str]] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def url(self, upstream: Upstream, path: str) -> str:
        return self._bases[upstream] + path

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        self._slots = None

    async def send(
        self, method: str, url: str, headers: list[tuple[str, str]], body: bytes | None
    ) -> UpstreamResponse:
        """Send a request; return once the response headers arrived."""
        slots = self._slots
        assert slots is not None, "UpstreamClient.start() was not called"
        origin, host, target = self._origin(url)
        try:
            request = encode_request(method, target, host, headers, body, USER_AGENT)
        except ValueError as exc:
            raise UpstreamUnavailable(f"ValueError: {exc}") from None
        await slots.acquire()
        conn: _Connection | None = None
        try:
            conn, reused = await self._checkout(origin)
            reader = conn.reader = ResponseReader(head=method == "HEAD")
            assert conn.transport is not None
            conn.transport.write(request)
            while not reader.headers_done:
                if conn.error is not None or conn.closed:
                    raise _before_response(conn, reused)
                await conn.wait(self.read_timeout)
        except BaseException as exc:
            if conn is not None:
                conn.close()
                self._open.discard(conn)
            slots.release()
            if isinstance(exc, UpstreamUnavailable | asyncio.CancelledError):
                raise
            if isinstance(exc, TimeoutError | OSError | ResponseError):
                raise UpstreamUnavailable(_describe(exc)) from exc
            raise
        return UpstreamResponse(self, conn, reader)

    def _origin(self, url: str) -> tuple[tuple[str, str, int], str, str]:
        """(scheme, host, port), the ``Host`` header and the request target of ``url``."""
        split = urlsplit(url)
        cached = self._origins.get(split.netloc + split.scheme)
        if cached is None:
            scheme = split.scheme.lower()
            if scheme not in ("http", "https") or not split.hostname:
                raise UpstreamUnavailable(
                    f"ValueError: the upstream URL {url!r} is not an http(s) URL")
            default = 443 if scheme == "https" else 80
            try:
                port = split.port or default
            except ValueError as exc:
                raise UpstreamUnavailable(f"ValueError: {exc} in {url!r}") from None
            name = split.hostname
            shown = f"[{name}]" if ":" in name else name
            host = shown if port == default else f"{shown}:{port}"
            cached = ((scheme, name, port), host, "")
            if len(self._origins) < 64:  # the configured upstreams, plus a few
                self._origins[split.netloc + split.scheme] = cached
        target = split.path or "/"
        if split.query:
            target += "?" + split.query
        return cached[0], cached[1], target

    async def _checkout(self, origin: tuple[str, str, int]) -> tuple[_Connection, bool]:
        """An idle connection to ``origin``, or a new one; and whether it was reused."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.error is None:
                return conn, True
            self._open.discard(conn)
        return await self._connect(origin), False

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls = None
        if scheme == "https":
            if self._ssl_context is None:  # loading the CA store costs ~20 ms: once, when needed
                self._ssl_context = ssl.create_default_context()
            tls = self._ssl_context
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(origin), host, port, ssl=tls,
                    server_hostname=host if tls is not None else None)
        except TimeoutError:
            raise UpstreamUnavailable(
                f"TimeoutError: connecting to {host}:{port} took over "
                f"{self.connect_timeout:g} s (LORE_UPSTREAM_CONNECT_TIMEOUT)") from None
        except (OSError, ssl.SSLError) as exc:
            raise UpstreamUnavailable(f"cannot connect to {host}:{port}: "
                                      f"{_describe(exc)}") from exc
        self._open.add(conn)
        return conn

    def _checked_in(self, conn: _Connection, *, reuse: bool) -> None:
        """A response is done with ``conn``: pool it (``reuse``) or drop it."""
        if self._slots is not None:
            self._slots.release()
        conn.reader = None
        if reuse and not conn.closed and self._slots is not None:
            idle = self._idle.setdefault(conn.origin, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                loop = asyncio.get_running_loop()
                conn.idle_since = loop.time()
                idle.append(conn)
                if self._sweep is None:  # one timer for the pool, not one per request
                    self._sweep = loop.call_later(self._idle_seconds, self._close_idle)
                return
        conn.close()
        self._open.discard(conn)

    def _close_idle(self) -> None:
        """Close the connections idle for ``idle_seconds``; again later while any are left."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        oldest = now
        for idle in self._idle.values():
            for conn in [c for c in idle if now - c.idle_since >= self._idle_seconds]:
                idle.remove(conn)
                conn.close()
                self._open.discard(conn)
            oldest = min([oldest, *(c.idle_since for c in idle)])
        if any(self._idle.values()):
            self._sweep = asyncio.get_running_loop().call_later(
                oldest + self._idle_seconds - now, self._close_idle)


def _before_response(conn: _Connection, reused: bool) -> UpstreamUnavailable:
    """The error for a connection that ended before the response's head."""
    error = conn.error
    reader = conn.reader
    if reader is not None and reader.raw_headers == [] and (
            error is None or isinstance(error, ResponseError | ConnectionError)):
        what = "on a reused keep-alive connection" if reused else "after connecting"
        return UpstreamDisconnected(
            f"ServerDisconnectedError: the upstream closed the connection {what} "
            "without answering")
    return UpstreamUnavailable(_describe(error or ConnectionResetError("connection closed")))


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
