"""Run an asyncio server in a background thread with its own event loop.

Synchronous callers (the openai/anthropic SDK clients, subprocess CLIs, a
blocking benchmark driver) cannot share an event loop with the server they
talk to: a blocking call would freeze the loop that has to answer it. So the
fake upstream and the gateway each get a daemon thread running a private loop;
``start()`` returns once the server is listening, ``stop()`` shuts it down
inside that loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import sys
import threading
import traceback
from collections.abc import Coroutine
from typing import Any, Generic, Protocol, TypeVar

# Starting or stopping a loopback server takes milliseconds; a server that needs
# longer is stuck, and the caller should hear about it rather than hang.
DEFAULT_TIMEOUT_S = 30.0
# A gateway's stop is bounded but can legitimately take longer on a loaded
# machine: its storage child gets up to 30 s to write what is queued, the niced
# embedding child 3 s to finish its batch, and each join after a kill 5 s
# (memory/service.py close). A ceiling, not a delay.
STOP_TIMEOUT_S = 90.0

T = TypeVar("T")


class StuckServer(TimeoutError):
    """A background server's start, stop or call did not finish in time."""


def where_everything_is(loop: asyncio.AbstractEventLoop) -> str:
    """Every thread's stack and ``loop``'s unfinished tasks, for a stuck call's error."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame, limit=12))
        parts.append(f"--- thread {names.get(ident, ident)}\n{stack}")
    try:
        tasks = asyncio.all_tasks(loop)
    except RuntimeError:  # the set changed while we read it
        tasks = set()
    for task in tasks:
        out = io.StringIO()
        task.print_stack(limit=8, file=out)
        parts.append(f"--- {out.getvalue()}")
    return "\n".join(parts)


class AsyncServer(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


S = TypeVar("S", bound=AsyncServer)


class BackgroundServer(Generic[S]):
    """Owns ``server`` and the thread whose event loop runs it.

    Usable as a context manager::

        with BackgroundServer(FakeUpstream()) as fake:
            requests.post(fake.url + "/v1/responses", ...)
    """

    def __init__(self, server: S, *, name: str = "lore-background") -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = DEFAULT_TIMEOUT_S) -> T:
        """Run ``coro`` on the server's loop and wait for its result; past
        ``timeout``, a ``StuckServer`` that shows where every thread and task is."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StuckServer(f"{self._thread.name}: no result within {timeout:g} s\n"
                              f"{where_everything_is(self._loop)}") from None

    def start(self, timeout: float = DEFAULT_TIMEOUT_S) -> S:
        self._thread.start()
        try:
            self.call(self.server.start(), timeout)
        except BaseException:
            self._halt()
            raise
        return self.server

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.call(self.server.stop(), timeout)
        finally:
            self._halt(timeout)

    def _halt(self, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Cancel what is still running on the loop, stop it and join the thread."""

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self._loop.is_running():
            self.call(cancel_rest(), timeout)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self) -> S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
