"""The client side of one exchange: ASGI ``send`` plus disconnect detection.

uvicorn silently drops writes after a client disconnects, so a relay would keep
reading from the upstream (and paying for tokens) for nobody. ``watch`` runs a
relay while listening for ``http.disconnect`` and cancels the relay the moment
the client goes away; cancelling closes the upstream response, which cancels
the upstream request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
RawHeaders = list[tuple[bytes, bytes]]
T = TypeVar("T")

JSON_HEADERS: RawHeaders = [(b"content-type", b"application/json")]
SSE_HEADERS: RawHeaders = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


class ClientChannel:
    """Writes one HTTP response to the client."""

    __slots__ = ("_send", "started", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.status = 0

    async def start(self, status: int, headers: RawHeaders) -> None:
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, data: bytes) -> None:
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(
        self, status: int, body: bytes, headers: RawHeaders = JSON_HEADERS, *, head: bool = False
    ) -> None:
        """A complete response in one go (``head``: headers only, as for HEAD)."""
        length = (b"content-length", str(len(body)).encode())
        await self.start(status, [*headers, length])
        await self.end(b"" if head else body)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def watch(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to completion unless the client disconnects first.

    Raises ``ClientGone`` after cancelling ``work`` when the client goes away.
    Call only after the request body has been read in full.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:  # the relay's own error is moot once the client is gone
        pass
    raise ClientGone
