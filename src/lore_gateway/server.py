"""The asyncio shell around the app: listener socket, uvicorn, lifecycle.

The listener is created here rather than by uvicorn so that ``TCP_NODELAY`` is
set on it (Linux copies it to every accepted socket). Without it, small SSE
frames meet Nagle's algorithm and the peer's delayed ACK: about 40 ms per
request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from collections.abc import Iterator
from functools import partial
from typing import Any

import uvicorn

from lore_gateway.app import GatewayApp
from lore_gateway.config import Settings
from lore_gateway.http_protocol import ConnectionLimits, protocol_class
from lore_gateway.memory import db
from lore_gateway.memory.amnesia import AmnesiaSwitch
from lore_gateway.obs import metrics
from lore_gateway.proxy import Proxy
from lore_gateway.recall.service import RecallService
from lore_gateway.turns import TurnSink
from lore_gateway.upstream import UpstreamBroken, UpstreamClient
from lore_gateway.worker.wiring import Background

log = logging.getLogger("lore.server")


class _QuietExpectedErrors(logging.Filter):
    """uvicorn warns on every WebSocket attempt (Codex makes one per session),
    which the gateway answers with 426 on purpose, and logs a traceback when a
    response is aborted, which the proxy does on purpose when the upstream breaks
    mid-body (and logs itself). Both would be noise."""

    _NOISE = ("Unsupported upgrade request", "No supported WebSocket library")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], UpstreamBroken):
            # The proxy aborts the client connection on purpose and logs why.
            return False
        return not record.getMessage().startswith(self._NOISE)


logging.getLogger("uvicorn.error").addFilter(_QuietExpectedErrors())


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket with ``TCP_NODELAY`` and ``SO_REUSEADDR``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handling.

    uvicorn catches SIGINT/SIGTERM for the duration of ``serve()`` and raises
    them again once it returns, which ends the process before the gateway
    flushes its memory writer and stops its embedding process. ``lore serve``
    handles the signals itself (``Gateway.request_stop``).
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Gateway:
    """A running gateway: ``await start()``, then ``url``; ``await stop()`` to end.

    ``memory`` is the memory store to use; by default one is opened from the
    settings (or none when ``LORE_STORE=false``).
    """

    def __init__(self, settings: Settings, *, memory: Any = "auto") -> None:
        self.settings = settings
        self._memory_arg = memory
        self.memory: Any = None
        self.upstream = UpstreamClient(settings)
        self.recall: RecallService | None = None
        self.background: Background | None = None
        self._server: _Server | None = None
        self._app: GatewayApp | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self._grace: asyncio.Task[None] | None = None
        self.proxy: Proxy | None = None
        self.amnesia: AmnesiaSwitch | None = None
        self.port = settings.port

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        self._sock = listen_socket(self.settings.host, self.settings.port)
        self.port = self._sock.getsockname()[1]
        if self._memory_arg == "auto":
            if self.settings.store:
                from lore_gateway.memory.service import Memory

                self.memory = await asyncio.to_thread(
                    partial(Memory.open, self.settings,
                            turn_process=self.settings.store_process))
        else:
            self.memory = self._memory_arg
        await self.upstream.start()
        if self.memory is not None:
            memory = self.memory
            metrics.set_queue_depth_source(lambda: memory.queue_depth)
        if self.memory is not None:
            # `lore amnesia` and /ui's switch (memory/amnesia.py), read off the loop.
            self.amnesia = await asyncio.to_thread(
                AmnesiaSwitch, db.conn_factory(self.memory.database))
        turns = TurnSink(self.memory, max_json_bytes=self.settings.max_response_body_bytes,
                         max_stored_chars=self.settings.store_max_message_bytes + 1,
                         amnesia=self.amnesia)
        if self.memory is not None and self.settings.recall:
            self.recall = RecallService(self.memory, self.upstream)
        self.proxy = Proxy(self.settings, self.upstream, turns, self.recall)
        if self.memory is not None:
            from lore_gateway.compaction.service import CompactionService

            self.proxy.compaction = CompactionService(self.settings, self.memory,
                                                      expands=self.recall is not None)
        self.background = await Background.attach(self.settings, self.memory, self.upstream,
                                                  self.proxy, self.recall)
        app = self._app = GatewayApp(self.proxy, memory_degraded=self._memory_degraded)
        limits = ConnectionLimits(
            header_timeout=self.settings.header_timeout,
            body_timeout=self.settings.body_timeout,
            max_header_bytes=self.settings.max_header_bytes,
            max_connections=self.settings.max_connections,
        )
        config = uvicorn.Config(
            app,
            lifespan="off",
            ws="none",
            http=protocol_class(limits),
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=75,
            # A backstop only: _end_after_grace ends the streams at the grace, and
            # their handlers return at once.
            timeout_graceful_shutdown=math.ceil(self.settings.shutdown_grace) + 1,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)

    def _memory_degraded(self) -> str | None:
        if self.memory is None:
            return None
        reason: str | None = getattr(self.memory, "degraded", None)
        return reason

    def request_stop(self) -> None:
        """Begin a graceful shutdown (a signal handler may call this): stop
        accepting, let open responses run for ``shutdown_grace`` seconds, then end
        them with their protocol's error event."""
        if self._app is not None:
            self._app.ui.stopping()  # live /ui streams end, so the server can stop
        if self._server is not None:
            self._server.should_exit = True
        if self._grace is None and self.proxy is not None:
            self._grace = asyncio.get_running_loop().create_task(self._end_after_grace())

    async def _end_after_grace(self) -> None:
        assert self.proxy is not None
        if self.proxy.active:
            log.info("waiting up to %.0f s for %d open responses (LORE_SHUTDOWN_GRACE)",
                     self.settings.shutdown_grace, self.proxy.active)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proxy.wait_idle(), self.settings.shutdown_grace)
        if self.proxy.active:
            log.warning("shutdown grace over: ending %d open responses", self.proxy.end_streams())

    async def wait(self) -> None:
        """Until the server stops (a signal, or ``stop()``)."""
        assert self._task is not None
        await self._task

    async def stop(self) -> None:
        self.request_stop()
        if self._task is not None:
            await self._task
        if self._grace is not None:
            self._grace.cancel()
        if self._app is not None:
            await asyncio.to_thread(self._app.ui.close)  # the last metrics sample
            await self._app.mcp.close()
        if self.background is not None:
            await self.background.stop()
        await self.upstream.close()
        metrics.set_queue_depth_source(None)
        if self.recall is not None:
            await asyncio.to_thread(self.recall.close)
        if self.amnesia is not None:
            await asyncio.to_thread(self.amnesia.close)
        if self.memory is not None and self._memory_arg == "auto":
            await asyncio.to_thread(self.memory.close)
        if self._sock is not None:
            self._sock.close()
