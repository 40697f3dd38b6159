"""HTTP/1.1 for the upstream leg, sans-IO: a request's bytes out, a response's
events in.

The gateway sends one kind of request (a method, a target, a few headers, a
body known in full) and reads one response per connection turn, so the
general-purpose client it used (aiohttp's) did far more per request than this
needs: the third round of issue 14 measured it at 15-20% of the event loop's
samples. This module is the protocol half of the lean client in
:mod:`lore_gateway.upstream`: :func:`encode_request` builds the whole request
(head and body, one write), :class:`ResponseReader` turns the bytes read into a
status, headers and decoded body chunks (httptools, the parser uvicorn already
uses for the client side). No sockets here, so every framing case is testable
with bytes alone.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import httptools

RawHeaders = list[tuple[bytes, bytes]]

# The encodings the client asks for and decodes (``Content-Encoding``), as the
# previous client did (``auto_decompress``).
ACCEPT_ENCODING = "gzip, deflate"
_DEFAULT_HEADERS = (("accept", "*/*"), ("accept-encoding", ACCEPT_ENCODING))
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


class ResponseError(Exception):
    """The upstream's bytes are not a valid HTTP/1.1 response (or its encoding)."""


def encode_request(method: str, target: str, host: str, headers: list[tuple[str, str]],
                   body: bytes | None, user_agent: str) -> bytes:
    """The request's bytes, head and body together.

    ``headers`` are the client's (already filtered of hop-by-hop ones); ``Host``,
    the body's length and any of ``Accept``, ``Accept-Encoding`` or
    ``User-Agent`` the client did not send are added. Raises ``ValueError`` on
    a header that would split the request (a CR or LF in a name or value).
    """
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    present: set[str] = set()
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break; it cannot be sent")
        present.add(name.lower())
        lines.append(f"{name}: {value}")
    for name, value in _DEFAULT_HEADERS:
        if name not in present:
            lines.append(f"{name}: {value}")
    if "user-agent" not in present:
        lines.append(f"user-agent: {user_agent}")
    if body is not None or method not in _NO_BODY_METHODS:
        lines.append(f"content-length: {len(body) if body else 0}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


class ResponseReader:
    """One response read from a connection: feed it bytes, read its state.

    ``headers_done`` once the head is parsed (``status``, ``raw_headers``);
    decoded body bytes gather in ``body`` until taken with :meth:`take`;
    ``complete`` once the body ended as framed. ``keep_alive`` says whether the
    connection may carry another request afterwards.
    """

    __slots__ = ("_decoder", "_head_only", "_parser", "_until_close", "body", "buffered",
                 "complete", "headers_done", "keep_alive", "raw_headers", "status")

    def __init__(self, *, head: bool = False) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._decoder: _Decoder | None = None
        self._until_close = False
        self.status = 0
        self.raw_headers: RawHeaders = []
        self.body: list[bytes] = []
        self.buffered = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self._head_only = head

    # --- input ----------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes read from the connection; raises ``ResponseError`` when they are
        not a valid response."""
        if self.complete:
            if data:  # bytes after a complete response: the connection is not reusable
                self.keep_alive = False
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, ResponseError):  # raised by a callback below
                raise exc.__context__ from None
            raise ResponseError(f"invalid HTTP response from the upstream: {exc}") from None

    def feed_eof(self) -> None:
        """The connection was closed. A body framed by the close ends here; any
        other unfinished response raises ``ResponseError``."""
        if self.complete:
            return
        if self.headers_done and self._until_close:
            self._finish()
            return
        raise ResponseError("the upstream closed the connection before the response was complete"
                            if self.headers_done else
                            "the upstream closed the connection before sending a response")

    def take(self) -> bytes:
        """The decoded body bytes gathered so far (then cleared)."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        return data

    # --- httptools callbacks ---------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        self.status = parser.get_status_code()
        if 100 <= self.status < 200:  # an interim response; the real one follows
            self.raw_headers = []
            return
        self.headers_done = True
        self.keep_alive = parser.should_keep_alive()
        length = chunked = False
        for name, value in self.raw_headers:
            lower = name.lower()
            if lower == b"content-length":
                length = True
            elif lower == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lower == b"content-encoding":
                self._decoder = _decoder(value)
        if self._head_only or self.status in (204, 304):
            # No body follows, whatever the head says: the parser would wait for one.
            self._finish()
            self.keep_alive = False
            return
        self._until_close = not (length or chunked)

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error as exc:
                raise ResponseError(f"the upstream's compressed body is corrupt: {exc}") from None
        if body:
            self.body.append(body)
            self.buffered += len(body)

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200 and not self.headers_done:
            return
        self._finish()

    def _finish(self) -> None:
        if self.complete:
            return
        self.complete = True
        if self._decoder is not None:
            try:
                rest = self._decoder.flush()
            except zlib.error as exc:
                raise ResponseError(f"the upstream's compressed body is corrupt: {exc}") from None
            if rest:
                self.body.append(rest)
                self.buffered += len(rest)


def _decoder(encoding: bytes) -> _Decoder | None:
    """A decompressor for ``encoding``; None for identity or one not asked for
    (those bytes are relayed as they came)."""
    value = encoding.strip().lower()
    if value in (b"gzip", b"x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if value == b"deflate":
        return _DeflateDecoder()
    return None


class _DeflateDecoder:
    """``deflate`` is meant to be zlib-wrapped (RFC 9110 §8.4.1.2), but some
    servers send raw deflate: the first bytes decide which."""

    __slots__ = ("_inner",)

    def __init__(self) -> None:
        self._inner: zlib._Decompress | None = None

    def decompress(self, data: bytes) -> bytes:
        if self._inner is None:
            if not data:
                return b""
            zlib_header = len(data) >= 2 and (data[0] & 0x0F) == 8 and (
                (data[0] << 8) | data[1]) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)
        return self._inner.decompress(data)

    def flush(self) -> bytes:
        return self._inner.flush() if self._inner is not None else b""


if TYPE_CHECKING:
    _Decoder = zlib._Decompress | _DeflateDecoder
