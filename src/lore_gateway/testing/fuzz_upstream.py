"""A fuzzing fake provider: it answers each request with exactly the bytes it is
told to, so a fuzzer can feed the gateway malformed upstream streams.

The plan for the next request (status, content type, chunks, and whether to end
with a TCP reset) is set by the caller before it sends the request; one client
drives it at a time, as the hypothesis suite and ``lore bench fuzz`` do. With no
plan, a request gets a well-formed text answer of its protocol, so fuzzed client
requests reach a provider that always behaves.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass

from aiohttp import web

from lore_gateway.testing import fake_streams as fs

MODEL = "fuzz-model"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the fuzz upstream answers to the next request."""

    chunks: tuple[bytes, ...]
    status: int = 200
    content_type: str = "text/event-stream"
    reset: bool = False  # end with a TCP reset instead of a clean end


def well_formed(api: str, stream: bool) -> Plan:
    """A correct text answer of ``api`` ("responses", "chat", "anthropic")."""
    if api == "chat":
        answer = fs.chat_text("fuzz answer text", MODEL, usage_chunk=False)
    elif api == "anthropic":
        answer = fs.anthropic_text("fuzz answer text", MODEL)
    else:
        answer = fs.responses_text("fuzz answer text", MODEL)
    if stream:
        return Plan(answer.frames)
    return Plan((answer.body,), content_type="application/json")


def _api_of(path: str) -> str:
    if "chat/completions" in path:
        return "chat"
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "responses"


class FuzzUpstream:
    """``await start()``, then ``url``; ``plan = Plan(...)`` before each request."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.requests = 0
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = web.Server(self._handle, access_log=None)
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._server, "127.0.0.1", 0)
        self.port = self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(1.0)
        if self._listener is not None:
            await self._listener.wait_closed()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.requests += 1
        raw = await request.read()
        plan, self.plan = self.plan, None
        if plan is None:
            path = request.path
            if request.method != "POST" or path.endswith("count_tokens"):
                return web.Response(body=b'{"ok": true}', content_type="application/json")
            wants_stream = b'"stream":true' in raw.replace(b" ", b"") or "codex" in path
            plan = well_formed(_api_of(path), wants_stream)
        response = web.StreamResponse(status=plan.status,
                                      headers={"Content-Type": plan.content_type})
        await response.prepare(request)
        try:
            for chunk in plan.chunks:
                await response.write(chunk)
            if plan.reset:
                await asyncio.sleep(0)
                _reset(request)
                return response
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response


def _reset(request: web.BaseRequest) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
