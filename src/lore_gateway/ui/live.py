"""Live updates for the overview and the session view: server-sent events.

``/ui/events/overview`` sends the chart series each time the sampler stores a
sample; ``/ui/events/session?id=<session>`` sends the session's version (turn
count, newest message id) when it changes, and the page then fetches the new
turns. Both watch cheap in-memory or single-row state every :data:`POLL_SECONDS`
(the session's row is read on a thread), so a stream costs almost nothing while
nothing happens.

Streams are bounded (:data:`MAX_STREAMS`), end after :data:`MAX_STREAM_SECONDS`
(the browser's EventSource reconnects by itself) and end at once when the
gateway stops, so a forgotten tab never holds a shutdown open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.channel import Receive, Send
from lore_gateway.ui import http, queries, samples
from lore_gateway.ui.auth import Viewer

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

# How often a stream looks for news. Half a second reads as "live" to a person.
POLL_SECONDS = 0.5
# Open streams per gateway: a few tabs per person; more would only be a flood.
MAX_STREAMS = 64
# A stream's lifetime; EventSource reconnects after ``retry`` ms.
MAX_STREAM_SECONDS = 300
HEARTBEAT_SECONDS = 15


class Streams:
    def __init__(self, memory: Memory | None, sampler: samples.Sampler | None, *,
                 team: bool) -> None:
        self._memory = memory
        self._sampler = sampler
        # Team mode: a member's charts follow their own memory, never others' traffic.
        self._team = team
        self._open = 0
        self._stop_flag = False

    def stop(self) -> None:
        self._stop_flag = True

    async def serve(self, request: http.Request, viewer: Viewer, receive: Receive,
                    send: Send) -> None:
        kind = request.path.rstrip("/").removeprefix("/ui/events/")
        memory = self._memory
        if kind not in ("overview", "session") or memory is None:
            await http.respond(send, 404, b"no such stream", "text/plain")
            return
        if self._open >= MAX_STREAMS:
            await http.respond(send, 503, b"too many live views open; close a tab",
                               "text/plain", [(b"retry-after", b"10")])
            return
        self._open += 1
        try:
            await self._stream(memory, kind, request, viewer, receive, send)
        finally:
            self._open -= 1

    async def _stream(self, memory: Memory, kind: str, request: http.Request,
                      viewer: Viewer, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"), *http.SECURITY_HEADERS]})
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        watcher = asyncio.create_task(watch())
        window = samples.WINDOWS.get(request.arg("window"), samples.WINDOWS["1h"])
        session = request.arg("id")
        started = last_beat = time.monotonic()
        seen: Any = None
        try:
            await send({"type": "http.response.body", "body": b"retry: 1000\n\n",
                        "more_body": True})
            while not gone.is_set() and not self._stop_flag:
                if kind == "overview" and not self._team:
                    version: Any = self._sampler.version if self._sampler else 0
                elif kind == "overview":
                    version = await asyncio.to_thread(memory.read, lambda c: (
                        queries.tenant_version(c, viewer.tenant)))
                else:
                    version = await asyncio.to_thread(memory.read, lambda c: (
                        queries.session_version(c, viewer.tenant, session)))
                if version != seen:
                    if kind == "overview":
                        data = await asyncio.to_thread(memory.read, lambda c: (
                            samples.series_for(c, viewer.tenant if self._team else None,
                                               window)))
                    else:
                        data = {"turns": version[0], "newest": version[1]}
                    frame = b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
                    seen = version
                now = time.monotonic()
                if now - started > MAX_STREAM_SECONDS:
                    break
                if now - last_beat > HEARTBEAT_SECONDS:
                    await send({"type": "http.response.body", "body": b": beat\n\n",
                                "more_body": True})
                    last_beat = now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_SECONDS):
                        await gone.wait()
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the browser went away mid-send
        finally:
            watcher.cancel()
