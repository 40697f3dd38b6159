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


class ScaledUsageChannel(ClientChannel):
    __slots__ = ("_json", "_pending", "rewriter")

    def __init__(self, send: Send, cap: UsageCap) -> None:
        super().__init__(send)
        self.rewriter = UsageRewriter(cap)
        self._json = False
        self._pending = bytearray()

    async def start(self, status: int, headers: RawHeaders) -> None:
        self._json = 200 <= status < 300 and any(
            n.lower() == b"content-type" and b"json" in v.lower() for n, v in headers)
        await super().start(status, headers)

    async def write(self, data: bytes) -> None:
        if self._json:
            # A streamed-through JSON body is rewritten whole at its end.
            self._pending += data
            return
        await super().write(self.rewriter.feed(data))

    async def end(self, data: bytes = b"") -> None:
        if self._json:
            body = bytes(self._pending) + data
            self._pending.clear()
            await super().end(self.rewriter.json_body(body))
            return
        await super().end(self.rewriter.feed(data) + self.rewriter.close())

    async def respond(self, status: int, body: bytes, headers: RawHeaders = JSON_HEADERS, *,
                      head: bool = False) -> None:
        if 200 <= status < 300 and not head:
            body = self.rewriter.json_body(body)
        self._json = False
        length = (b"content-length", str(len(body)).encode())
        await ClientChannel.start(self, status, [*headers, length])
        await ClientChannel.end(self, b"" if head else body)
