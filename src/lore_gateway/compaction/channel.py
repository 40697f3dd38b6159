"""The client channel of an agent whose usage is scaled (``usage.py``).

One small subclass instead of a branch in the relay: the proxy swaps it in for
the plain channel only when the client is a compacting agent, so every other
exchange keeps the untouched hot path. Every writer (the plain relay, the
recall handlers, JSON answers) goes through it; what the upstream sent, and
therefore what storage and calibration see, is never changed.
"""

from __future__ import annotations

from lore_gateway.channel import JSON_HEADERS, ClientChannel, RawHeaders, Send
from lore_gateway.compaction.usage import UsageCap, UsageRewriter

# A relayed JSON body is held to rewrite its usage up to this size; a larger
# one (no agent asks for one) goes on unchanged.
MAX_JSON_BYTES = 16 << 20


class ScaledUsageChannel(ClientChannel):
    __slots__ = ("_mode", "_pending", "rewriter")

    def __init__(self, send: Send, cap: UsageCap) -> None:
        super().__init__(send)
        self.rewriter = UsageRewriter(cap)
        self._mode = "sse"  # "sse": frames rewritten; "json": held whole; "raw": as is
        self._pending = bytearray()

    async def start(self, status: int, headers: RawHeaders) -> None:
        json = any(n.lower() == b"content-type" and b"json" in v.lower() for n, v in headers)
        self._mode = "raw" if not 200 <= status < 300 else "json" if json else "sse"
        await super().start(status, headers)

    async def write(self, data: bytes) -> None:
        if self._mode == "sse":
            await super().write(self.rewriter.feed(data))
        elif self._mode == "json":
            self._pending += data
            if len(self._pending) > MAX_JSON_BYTES:
                self._mode = "raw"
                await super().write(self._take())
        else:
            await super().write(data)

    async def end(self, data: bytes = b"") -> None:
        if self._mode == "sse":
            data = self.rewriter.feed(data) + self.rewriter.close()
        elif self._mode == "json":
            data = self.rewriter.json_body(self._take() + data)
        await super().end(data)

    async def respond(self, status: int, body: bytes, headers: RawHeaders = JSON_HEADERS, *,
                      head: bool = False) -> None:
        if 200 <= status < 300 and not head:
            body = self.rewriter.json_body(body)
        length = (b"content-length", str(len(body)).encode())
        await ClientChannel.start(self, status, [*headers, length])
        await ClientChannel.end(self, b"" if head else body)

    def _take(self) -> bytes:
        held = bytes(self._pending)
        self._pending.clear()
        return held
