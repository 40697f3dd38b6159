"""The client side of one exchange: ASGI ``send`` plus disconnect detection.

uvicorn silently drops writes after a client disconnects, so a relay would keep
reading from the upstream (and paying for tokens) for nobody. ``watch`` runs a
relay while listening for ``http.disconnect`` and cancels the relay the moment
the client goes away; cancelling closes the upstream response, which cancels
the upstream request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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


# How long a relay whose client left with the whole answer may still read the
# provider's end of body: a provider ends it at once; one that does not is cut.
AFTER_ANSWER_S = 5.0


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


async def watch(receive: Receive, work: Awaitable[T], *,
                delivered: Callable[[], bool] | None = None) -> T:
    """Run ``work`` (a coroutine, or a task already running) to completion unless
    the client disconnects first.

    Raises ``ClientGone`` after cancelling ``work`` when the client goes away.
    Call only after the request body has been read in full.

    A client that leaves once ``delivered()`` says it has the whole answer (Codex
    exits on ``response.completed``) does not cut ``work``: it gets
    ``AFTER_ANSWER_S`` to read the provider's end of body and end the turn whole,
    as if the client had stayed (uvicorn drops the last writes).

    The caller awaits ``work`` itself and the disconnect listener only cancels
    it: the caller resumes one loop iteration after ``work`` ends. (Waiting on
    both with ``asyncio.wait`` took two more hand-offs, and under load every
    hand-off waits a whole iteration: 150-400 ms at 200 clients on 2 CPUs.)
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    gone = False
    late: asyncio.TimerHandle | None = None

    def cut() -> None:
        nonlocal gone
        if not task.done():
            gone = True
            task.cancel()

    def disconnected(listener: asyncio.Future[None]) -> None:
        nonlocal late
        if listener.cancelled() or listener.exception() is not None or task.done():
            return
        if delivered is not None and delivered():
            late = asyncio.get_running_loop().call_later(AFTER_ANSWER_S, cut)
        else:
            cut()

    watcher.add_done_callback(disconnected)
    try:
        result = await task
    except (asyncio.CancelledError, Exception):
        if not gone or _cancelling():
            raise
        # The relay's own error (its cancellation included) is moot once the
        # client is gone.
        raise ClientGone from None
    finally:
        watcher.remove_done_callback(disconnected)
        watcher.cancel()
        if late is not None:
            late.cancel()
    if gone:
        raise ClientGone
    return result


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (shutdown), not only
    the work it awaited."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
