"""Connection hygiene on top of uvicorn's httptools protocol.

uvicorn closes idle keep-alive connections, but not a connection that never
finishes its request: 20,000 sockets that send nothing (or half a header, or
part of a body) exhausted the gateway's file descriptors. Nor does httptools
bound the header block: a 64 MiB header stalled the event loop for 7 s. This
subclass adds what is missing, each checked before any costly work:

- a deadline for the request head (``header_timeout``), from the first byte of
  a request (or the connection's start) to the end of its headers: 408;
- an idle deadline for the body (``body_timeout``): 408;
- a bound on the header block (``max_header_bytes``), counted on the raw bytes
  before the parser sees them: 431;
- a bound on open connections (``max_connections``): a 503 with a JSON body the
  moment the connection is accepted, instead of an fd that never comes back.

uvicorn's own ``limit_concurrency`` answers a plain-text 503 and counts only
after the headers were parsed, so it is not used.

It also sends a response's head together with the first body bytes when both
are written in the same loop iteration (``_HeadWithBody``): uvicorn writes each
ASGI message at once, one system call and one wake-up of the client each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("lore.http")

# The end of a request head. Three bytes of the previous chunk are kept so a
# terminator split across two reads is still found.
_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout: float
    body_timeout: float
    max_header_bytes: int
    max_connections: int


def _raw_response(status: int, reason: str, error_type: str, message: str) -> bytes:
    body = orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


def protocol_class(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The uvicorn ``http`` protocol class enforcing ``limits``."""

    class GatewayHttpProtocol(_LimitedProtocol):
        _limits = limits

    return GatewayHttpProtocol


class _LimitedProtocol(HttpToolsProtocol):
    _limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_body = 0.0

    # --- connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self._limits
        if len(self.connections) > limits.max_connections:
            log.warning("connection refused: %d connections open (LORE_MAX_CONNECTIONS=%d)",
                        len(self.connections) - 1, limits.max_connections)
            self._refuse(503, "Service Unavailable", "overloaded_error",
                         f"The gateway has {limits.max_connections} connections open, its "
                         "limit; retry shortly, or raise LORE_MAX_CONNECTIONS.")
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head and not self._count_head(data):
            return
        super().data_received(data)

    # --- parser callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._tail = b""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = _HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]
        self._last_body = time.monotonic()
        self._body_timer = self.loop.call_later(self._limits.body_timeout, self._on_body_timer)

    def on_body(self, body: bytes) -> None:
        self._last_body = time.monotonic()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # --- limits --------------------------------------------------------------------

    def _count_head(self, data: bytes) -> bool:
        """Add this read to the header block; False when it is over the limit."""
        end = data.find(_HEAD_END)
        if end >= 0:
            used = end + 4
        else:  # a terminator split across two reads: only the seam is joined
            seam = (self._tail + data[:3]).find(_HEAD_END)
            used = seam + 4 - len(self._tail) if seam >= 0 else len(data)
        self._head_bytes += used
        self._tail = data[-3:]
        if self._head_bytes <= self._limits.max_header_bytes:
            return True
        log.warning("request refused: header block over %d bytes", self._limits.max_header_bytes)
        self._refuse(431, "Request Header Fields Too Large", "invalid_request_error",
                     f"Request headers exceed the gateway limit of "
                     f"{self._limits.max_header_bytes} bytes; raise LORE_MAX_HEADER_BYTES "
                     "if this is legitimate.")
        return False

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self._limits.header_timeout, self._on_head_timeout)

    def _on_head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, "Request Timeout", "timeout_error",
                         f"The request headers did not arrive within "
                         f"{self._limits.header_timeout:g} s (LORE_HEADER_TIMEOUT).")

    def _on_body_timer(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        idle = time.monotonic() - self._last_body
        remaining = self._limits.body_timeout - idle
        if remaining > 0:
            self._body_timer = self.loop.call_later(remaining, self._on_body_timer)
            return
        started = self.cycle is not None and self.cycle.response_started
        if started:
            self.transport.close()
            return
        self._refuse(408, "Request Timeout", "timeout_error",
                     f"The request body stalled for {self._limits.body_timeout:g} s "
                     "(LORE_BODY_TIMEOUT).")

    def _refuse(self, status: int, reason: str, error_type: str, message: str) -> None:
        self._cancel_timers()
        if self.cycle is not None:
            # The handler waiting for the body sees a disconnect and stops.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(_raw_response(status, reason, error_type, message))
            self.transport.close()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


class _HeadWithBody:
    """The transport as one response's cycle sees it: the response head is held
    until the end of the loop iteration, so that body bytes written in the same
    iteration go out with it in one write (a streamed answer's first events
    usually arrive in the same read as the upstream's head).

    Held for one iteration at most (``call_soon``): the client never waits for a
    head longer than it did. A ``100 Continue`` goes out at once.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = b""  # b"": nothing written yet; None: no longer holding

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._transport.write(data)
        elif held:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 100 "):
            self._transport.write(data)
        else:
            self._held = data
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()
