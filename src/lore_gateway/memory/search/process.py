"""Searches in their own process, so they never compete with the relay for the GIL.

In the gateway's process, one search thread competed with the event loop for the
GIL: with 100 recall clients among 200, a search that takes 13-132 ms idle took
27 s to come back. Here the search (BM25, vectors and the query embedding) runs
in a child process with its own interpreter; the gateway only pickles a query
and unpickles the hits.

The event loop drives each child over a socket pair itself: a query is one
length-prefixed pickle written to the socket, the hits come back the same way
and resolve a future. No thread of the gateway takes part (a process pool hands
every call and result over two threads, and under load each hand-off waited for
the gateway's GIL behind the relay).

Bounded: at most ``MAX_IN_FLIGHT`` searches wait or run at once (beyond it the
search fails fast with ``MemoryUnavailable``), and each is given
``timeout`` seconds (``SearchTimeout``). A child that dies is replaced on the next
search.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import socket
import struct
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lore_gateway.memory.child import ChildProcess
from lore_gateway.storage import db
from lore_gateway.storage.base import Database
from lore_gateway.storage.errors import MemoryUnavailable, SearchTimeout

if TYPE_CHECKING:
    from lore_gateway.memory.search.hits import SearchResult

log = logging.getLogger(__name__)

# Searches waiting or running at once. Each agent has at most one in flight, and
# 256 is more agents than a workstation runs; beyond that, failing fast beats a
# queue that outlasts the search timeout anyway.
MAX_IN_FLIGHT = 256
# Seconds one search may take, queueing included, before the recall goes on
# without it. Idle searches take 13-132 ms.
DEFAULT_TIMEOUT_S = 10.0


class _Replies(asyncio.Protocol):
    """The event loop's end of a child's socket.

    Each reply resolves its search's future inside ``data_received``: a reader
    task would wake the waiting recall one loop iteration later, and under load
    an iteration is hundreds of milliseconds (docs/reliability.md).
    """

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            (size,) = struct.unpack_from("!i", buffer)
            head = 4
            if size == -1:  # Connection's framing of a message over 2 GiB
                if len(buffer) < 12:
                    return
                (size,) = struct.unpack_from("!Q", buffer, 4)
                head = 12
            if len(buffer) < head + size:
                return
            message = bytes(buffer[head:head + size])
            del buffer[:head + size]
            self._worker.resolve(*pickle.loads(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self._worker.lost()


class _Worker:
    """One search child and the event loop's end of its socket pair.

    ``owned``: the child is ours (a dedicated search process, ended by ``stop``);
    otherwise it is the embedding process, which serves searches too, and ``stop``
    only closes our socket (the embedding process restarts its own child).
    """

    def __init__(self, process: ChildProcess, sock: socket.socket, *, owned: bool) -> None:
        self.process = process
        self._sock = sock
        self._owned = owned
        self.pending: dict[int, asyncio.Future[SearchResult]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._opening: asyncio.Task[asyncio.Transport] | None = None
        self.dead = False

    @classmethod
    def spawn(cls, address: str, embeddings: bool, rerank: bool) -> _Worker:
        """A dedicated search process."""
        ours, theirs = socket.socketpair()
        theirs_fd = theirs.detach()
        try:
            process = ChildProcess("lore_gateway.memory.search.child", "child_main",
                                   (theirs_fd, address, embeddings, os.getpid(), rerank),
                                   fds=(theirs_fd,))
        finally:
            os.close(theirs_fd)
        return cls(process, ours, owned=True)

    async def _connect(self) -> asyncio.Transport:
        # Opened once: the first searches arrive together, and two transports on
        # one socket would split each other's replies.
        if self._opening is None:
            self.loop = asyncio.get_running_loop()
            self._opening = self.loop.create_task(self._open())
        return await asyncio.shield(self._opening)

    async def _open(self) -> asyncio.Transport:
        assert self.loop is not None
        transport, _ = await self.loop.create_connection(lambda: _Replies(self),
                                                         sock=self._sock)
        self._transport = transport
        return transport

    async def ask(self, request_id: int, query: str, args: tuple[Any, ...]
                  ) -> asyncio.Future[SearchResult]:
        transport = await self._connect()
        if self.dead or transport.is_closing():
            raise ConnectionError("the search process's socket is closed")
        future: asyncio.Future[SearchResult] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        payload = pickle.dumps((request_id, query, args))
        # Connection's framing. No drain: queries are small and at most
        # MAX_IN_FLIGHT are outstanding, so the transport's buffer stays bounded.
        transport.write(struct.pack("!i", len(payload)) + payload)
        return future

    def resolve(self, request_id: int, ok: bool, value: Any) -> None:
        future = self.pending.pop(request_id, None)
        if future is None or future.done():
            return  # its search timed out meanwhile
        if ok:
            future.set_result(value)
        elif isinstance(value, MemoryUnavailable):
            future.set_exception(value)  # typed: the recall names the cause
        else:
            future.set_exception(RuntimeError(f"memory search failed: {value}"))

    def lost(self) -> None:
        """The socket closed: the child died or was stopped."""
        self.dead = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(MemoryUnavailable(
                    "the memory search process died; it is restarting"))
        self.pending.clear()

    def stop(self) -> None:
        """End an owned child (the transport sees the socket close), or, of a hosted
        one, close our socket."""
        self.dead = True
        if self._owned:
            self.process.terminate()
            self.process.join(timeout=2)
        if self._transport is not None and self.loop is not None:
            try:  # stop may run on a thread other than the transport's loop
                self.loop.call_soon_threadsafe(self._transport.close)
                return
            except RuntimeError:  # that loop is closed: close the socket itself
                pass
        self._sock.close()


class SearchHost(Protocol):
    """A process that serves searches besides its own work (the embedding process)."""

    def search_channel(self, dead: ChildProcess | None = None
                       ) -> tuple[socket.socket, ChildProcess] | None:
        """A socket to its search loop, owned by the caller, and the process (a new
        one if ``dead``, the one whose socket closed, was the current one); ``None``
        when it cannot serve (closed, or given up after repeated deaths)."""
        ...


class SearchProcess:
    """Search processes, each owning a ``Searcher``; ``search`` is awaited.

    With a ``host`` (the embedding process, which loads the model anyway) the
    searches run there: one model process for the gateway instead of one per
    search worker (~140 MiB each, docs/benchmarks.md "Memory"). Without one,
    ``workers`` dedicated search processes.
    """

    def __init__(self, database: Database | Path, *, embeddings: bool, workers: int = 1,
                 timeout: float = DEFAULT_TIMEOUT_S, max_in_flight: int = MAX_IN_FLIGHT,
                 host: SearchHost | None = None, rerank: bool = False) -> None:
        self._database = db.database(database)
        self._host = host
        self._workers = 1 if host is not None else max(1, workers)
        self._embeddings = embeddings
        self._rerank = rerank
        self.timeout = timeout
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._lock = threading.Lock()
        self._pool: list[_Worker] = []
        self._ids = itertools.count()
        self.restarts = 0
        self.timeouts = 0
        self.rejected = 0
        self.closed = False

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._pool if w.process.pid is not None]

    def _worker(self) -> _Worker:
        """The live worker with the fewest searches waiting, replacing dead ones."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.closed:
                raise MemoryUnavailable("memory is closed")
            for index, worker in enumerate(self._pool):
                moved = worker.loop is not None and worker.loop is not loop
                if worker.dead or moved or not worker.process.is_alive():
                    if not moved:
                        log.error("memory: the search process died; starting another")
                        self.restarts += 1
                    worker.stop()
                    self._pool[index] = self._new_worker(None if moved else worker.process)
            self._fill()
            return min(self._pool, key=lambda w: len(w.pending))

    def _fill(self) -> None:
        while len(self._pool) < self._workers:
            self._pool.append(self._new_worker())

    def _new_worker(self, dead: ChildProcess | None = None) -> _Worker:
        if self._host is None:
            return _Worker.spawn(self._database.address, self._embeddings, self._rerank)
        channel = self._host.search_channel(dead)
        if channel is None:  # the embedding process gave up: search BM25-only here
            return _Worker.spawn(self._database.address, False, self._rerank)
        sock, process = channel
        return _Worker(process, sock, owned=False)

    def warm(self) -> None:
        """Start the children now (they load the model), so the first recall does not wait."""
        with self._lock:
            if not self.closed:
                self._fill()

    async def search(self, query: str, *, tenant: str, project: str, session: str,
                     scope: str, limit: int) -> SearchResult:
        if self._in_flight >= self._max_in_flight:
            self.rejected += 1
            raise MemoryUnavailable(
                f"memory search is overloaded ({self._max_in_flight} searches in flight)")
        self._in_flight += 1
        request_id = next(self._ids)
        worker: _Worker | None = None
        try:
            worker = self._worker()
            async with asyncio.timeout(self.timeout):
                future = await worker.ask(request_id, query,
                                          (tenant, project, session, scope, limit))
                return await future
        except TimeoutError:
            self.timeouts += 1
            raise SearchTimeout(f"memory search took longer than {self.timeout:g} s") from None
        except (ConnectionError, OSError):
            raise MemoryUnavailable(
                "the memory search process died; it is restarting") from None
        finally:
            self._in_flight -= 1
            if worker is not None:
                worker.pending.pop(request_id, None)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            pool, self._pool = self._pool, []
        for worker in pool:
            # A search in progress is moot at shutdown; never wait for it.
            worker.stop()
