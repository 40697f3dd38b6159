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

import uvicorn

from lore_gateway.composition import Assembly, Background, build_gateway
from lore_gateway.config import Settings
from lore_gateway.http_protocol import ConnectionLimits, protocol_class
from lore_gateway.memory.data.amnesia import AmnesiaSwitch
from lore_gateway.memory.service import Memory
from lore_gateway.obs import metrics
from lore_gateway.proxy import Proxy
from lore_gateway.recall.service import RecallService
from lore_gateway.upstream import UpstreamBroken

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

    Its services are built by ``composition.build_gateway`` at start (the memory
    store opened from the settings, none with ``LORE_STORE=false``); ``memory``,
    ``proxy``, ``recall``, ``background`` and ``amnesia`` name them once started.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = settings.port
        self._assembly: Assembly | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None
        self._grace: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    @property
    def memory(self) -> Memory | None:
        return self._assembly.memory if self._assembly is not None else None

    @property
    def proxy(self) -> Proxy | None:
        return self._assembly.proxy if self._assembly is not None else None

    @property
    def recall(self) -> RecallService | None:
        return self._assembly.recall if self._assembly is not None else None

    @property
    def background(self) -> Background | None:
        return self._assembly.background if self._assembly is not None else None

    @property
    def amnesia(self) -> AmnesiaSwitch | None:
        return self._assembly.amnesia if self._assembly is not None else None

    async def start(self) -> None:
        # Bound first: a port in use fails before memory is opened.
        self._sock = listen_socket(self.settings.host, self.settings.port)
        self.port = self._sock.getsockname()[1]
        assembly = self._assembly = await build_gateway(self.settings)
        await assembly.start()
        memory = assembly.memory
        if memory is not None:
            metrics.set_queue_depth_source(lambda: memory.queue_depth)
        limits = ConnectionLimits(
            header_timeout=self.settings.header_timeout,
            body_timeout=self.settings.body_timeout,
            max_header_bytes=self.settings.max_header_bytes,
            max_connections=self.settings.max_connections,
        )
        config = uvicorn.Config(
            assembly.app,
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

    def request_stop(self) -> None:
        """Begin a graceful shutdown (a signal handler may call this): stop
        accepting, let open responses run for ``shutdown_grace`` seconds, then end
        them with their protocol's error event."""
        if self._assembly is not None:
            self._assembly.app.ui.stopping()  # live /ui streams end, so the server can stop
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
            async with asyncio.timeout(self.settings.shutdown_grace):
                await self.proxy.wait_idle()
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
        metrics.set_queue_depth_source(None)
        if self._assembly is not None:
            await self._assembly.close()
        if self._sock is not None:
            self._sock.close()
