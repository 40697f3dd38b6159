"""Searches in their own process, so they never compete with the relay for the GIL.

In the gateway's process, one search thread competed with the event loop for the
GIL: with 100 recall clients among 200, a search that takes 13-132 ms idle took
27 s to come back. Here the search (BM25, vectors and the query embedding) runs
in a child process with its own interpreter; the gateway only pickles a query
and unpickles the hits.

Bounded: at most ``MAX_IN_FLIGHT`` searches wait or run at once (beyond it the
search fails fast with ``MemoryUnavailable``), and each is given
``timeout`` seconds (``SearchTimeout``). A child that dies is replaced on the next
search.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lore_gateway.memory.errors import MemoryUnavailable, SearchTimeout

if TYPE_CHECKING:
    from lore_gateway.memory.search import Searcher, SearchResult

log = logging.getLogger(__name__)

# Searches waiting or running at once. Each agent has at most one in flight, and
# 256 is more agents than a workstation runs; beyond that, failing fast beats a
# queue that outlasts the search timeout anyway.
MAX_IN_FLIGHT = 256
# Seconds one search may take, queueing included, before the recall goes on
# without it. Idle searches take 13-132 ms.
DEFAULT_TIMEOUT_S = 10.0
# Query vectors remembered per search process (1.5 KiB each).
QUERY_CACHE_SIZE = 1024
# How often the child checks that the gateway that started it is alive.
PARENT_CHECK_S = 1.0
# The child's searcher (one per child process, built by the pool initializer).
_SEARCHER: Searcher | None = None


def _init(db_path: str, embeddings: bool, parent: int) -> None:
    global _SEARCHER
    threading.Thread(target=_exit_with_parent, args=(parent,), name="lore-search-parent",
                     daemon=True).start()
    from lore_gateway import heap
    from lore_gateway.memory import db
    from lore_gateway.memory.search import Searcher

    heap.name_process("lore-search")
    heap.start_trimmer()
    embedder = None
    if embeddings:
        from lore_gateway.memory.embed import load_embedder

        loaded = load_embedder()
        embedder = _QueryCache(loaded) if loaded is not None else None
    _SEARCHER = Searcher(db.conn_factory(Path(db_path)), embedder)  # type: ignore[arg-type]


class _QueryCache:
    """The embedder, remembering the vectors of recent queries.

    The query embedding is three quarters of a search's CPU (11 ms of 14 on this
    machine), and an agent asks the same question again: a follow-up recall, a
    retried turn, a second session on the same topic. The vectors are a pure
    function of the text, so a cache never changes a result.
    """

    def __init__(self, embedder: Any) -> None:
        self._embedder = embedder
        self.model_name = embedder.model_name
        self.dim = embedder.dim
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def embed(self, texts: list[str]) -> Any:
        if len(texts) != 1:
            return self._embedder.embed(texts)
        (text,) = texts
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        vectors = self._embedder.embed(texts)
        self._cache[text] = vectors
        if len(self._cache) > QUERY_CACHE_SIZE:
            self._cache.popitem(last=False)
        return vectors


def _exit_with_parent(parent: int) -> None:
    """A gateway killed with SIGKILL cannot stop us, and the pool's queue never
    reports it (this process holds both ends of its pipe): look for ourselves."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _search(query: str, tenant: str, project: str, session: str, scope: str,
            limit: int) -> SearchResult:
    assert _SEARCHER is not None
    return _SEARCHER.search(query, tenant=tenant, project=project, session=session,
                            scope=scope, limit=limit)


def _ping() -> int:
    return os.getpid()


class SearchProcess:
    """A pool of ``workers`` processes, each owning a ``Searcher``; ``search`` is awaited."""

    def __init__(self, db_path: Path, *, embeddings: bool, workers: int = 1,
                 timeout: float = DEFAULT_TIMEOUT_S, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._db_path = db_path
        self._workers = max(1, workers)
        self._embeddings = embeddings
        self.timeout = timeout
        self._max_in_flight = max_in_flight
        self._in_flight = 0
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self.restarts = 0
        self.timeouts = 0
        self.rejected = 0
        self.closed = False

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self.closed:
                raise MemoryUnavailable("memory is closed")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self._workers, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init,
                    initargs=(str(self._db_path), self._embeddings, os.getpid()))
            return self._pool

    def warm(self) -> None:
        """Start the children now (they load the model), so the first recall does not wait."""
        pool = self._executor()
        for _ in range(self._workers):
            pool.submit(_ping)

    async def search(self, query: str, *, tenant: str, project: str, session: str,
                     scope: str, limit: int) -> SearchResult:
        if self._in_flight >= self._max_in_flight:
            self.rejected += 1
            raise MemoryUnavailable(
                f"memory search is overloaded ({self._max_in_flight} searches in flight)")
        self._in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            pool = self._executor()
            try:
                # submit() itself raises BrokenProcessPool once the pool noticed a death.
                future = loop.run_in_executor(pool, _search, query, tenant, project, session,
                                              scope, limit)
                return await asyncio.wait_for(future, self.timeout)
            except TimeoutError:
                self.timeouts += 1
                raise SearchTimeout(
                    f"memory search took longer than {self.timeout:g} s") from None
            except BrokenProcessPool:
                self._replace(pool)
                raise MemoryUnavailable(
                    "the memory search process died; it is restarting") from None
        finally:
            self._in_flight -= 1

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                log.error("memory: the search process died; starting another")
                self.restarts += 1
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            pool, self._pool = self._pool, None
        if pool is None:
            return
        processes: dict[Any, Any] = dict(getattr(pool, "_processes", None) or {})
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes.values():
            # A search in progress is moot at shutdown; never wait for it.
            process.terminate()
        for process in processes.values():
            process.join(timeout=2)
