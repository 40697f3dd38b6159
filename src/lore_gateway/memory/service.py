"""The ``Memory`` facade: the one object the proxy, the CLI and the benches hold.

It wires the single writer thread, the search worker and (when the model is
present) the embedding worker, and keeps every blocking call off the caller's
event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lore_gateway.config import Settings
from lore_gateway.memory.data import catalog
from lore_gateway.memory.store.records import Identity, RawOutputs, RawTurn, TurnRecord
from lore_gateway.memory.store.sanitize import storable
from lore_gateway.memory.store.writer import TurnWriter
from lore_gateway.memory.tenancy import identity
from lore_gateway.memory.tenancy.keys import KeyRing
from lore_gateway.privacy import has_private, redact_turn
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db, schema
from lore_gateway.storage.base import Connection
from lore_gateway.storage.errors import MemoryUnavailable, SearchTimeout

if TYPE_CHECKING:
    from lore_gateway.memory.embed.embedder import Embedder
    from lore_gateway.memory.embed.process import EmbeddingProcess
    from lore_gateway.memory.search.process import SearchProcess
    from lore_gateway.memory.search.searcher import Searcher, SearchResult
    from lore_gateway.memory.store.process import TurnStoreProcess
    from lore_gateway.memory.store.traffic import TrafficClock

log = logging.getLogger(__name__)

T = TypeVar("T")

Scope = Literal["session", "project", "all"]
SCOPES: tuple[Scope, ...] = ("session", "project", "all")


class PendingTurn:
    """A turn in flight: its identity and new input, waiting for the response.

    The proxy creates it before forwarding and ends it exactly once: ``complete``
    when the response finished, ``abandon`` when it did not (client disconnect,
    upstream failure). Whichever is called first wins; later calls do nothing, so
    the proxy may call ``abandon`` unconditionally in a ``finally``.
    """

    __slots__ = ("_ended", "_lock", "_memory", "created_at", "identity", "inputs", "model",
                 "protocol", "side_channel")

    def __init__(self, memory: Memory, identity: Identity, protocol: str, model: str | None,
                 inputs: Sequence[Message], side_channel: str | None = None) -> None:
        self._memory = memory
        self.identity = identity
        self.protocol = protocol
        self.model = model
        self.inputs = tuple(inputs)
        self.created_at = time.time()
        # Why the call is a side channel (``knowledge.sidechannel.SideChannel``: a
        # title, a classifier, a one-shot), or None: stored, but never distilled,
        # and a helper's call never a search hit (``hits.hidden_side_channel``).
        self.side_channel = side_channel
        self._lock = threading.Lock()
        self._ended = False

    def complete(self, outputs: Sequence[Message], raw: RawOutputs | None = None) -> bool:
        """Store input + the complete output; ``True`` if the turn was queued.
        ``raw``: more output, still as the client's bytes (parsed by the writer)."""
        return self._end(outputs, complete=True, raw=raw)

    def abandon(self, partial_outputs: Sequence[Message] = ()) -> bool:
        """Store input + whatever output arrived, marked incomplete (docs/memory.md)."""
        return self._end(partial_outputs, complete=False)

    def _end(self, outputs: Sequence[Message], *, complete: bool,
             raw: RawOutputs | None = None) -> bool:
        with self._lock:
            if self._ended:
                return False
            self._ended = True
        if raw is not None and any(m.role == "user" and has_private(m.text)
                                   for m in self.inputs):
            # Private text may come back in the answer: parsed here (at most
            # RAW_OUTPUT_MAX_BYTES, about a millisecond), so the answer is redacted
            # too before anything leaves this process.
            from lore_gateway.collector import raw_outputs

            outputs, raw = (*outputs, *raw_outputs(raw)), None
        # Private spans become [private] here, where the turn is made (privacy.py):
        # nothing after this point ever holds them.
        messages = redact_turn(self.inputs + tuple(outputs))
        if raw is not None:
            return self._memory.submit_turn(RawTurn(TurnRecord(
                identity=self.identity, protocol=self.protocol, model=self.model,
                messages=messages, created_at=self.created_at, complete=complete,
            ), raw, self.side_channel))
        if not messages:
            return False
        metas = (({"side_channel": self.side_channel},) * len(messages)
                 if self.side_channel else None)
        return self._memory.submit_turn(TurnRecord(
            identity=self.identity, protocol=self.protocol, model=self.model,
            messages=messages, created_at=self.created_at, complete=complete, metas=metas,
        ))


class Memory:
    """The memory store: write path, search, detail lookup and housekeeping."""

    def __init__(self, settings: Settings, *, writer: TurnWriter,
                 embedder: Embedder | Literal["lazy"] | None,
                 embedding_worker: EmbeddingProcess | None,
                 turn_store: TurnStoreProcess | None = None) -> None:
        self.settings = settings
        # Where memory lives (either backend); every connection below opens it.
        self.database = settings.database
        self._keyring: KeyRing | None = None
        self.tenancy: identity.Tenancy = identity.PersonalTenancy()
        if settings.tenancy == "keys":
            self._keyring = KeyRing(db.conn_factory(self.database))
            self.tenancy = identity.KeyTenancy(self._keyring.tenant)
        self._writer = writer
        # Where turns go: the storage process (the gateway), or the writer thread.
        self._turn_store = turn_store
        self._conn_factory = db.conn_factory(self.database)
        # "lazy": the model is installed, but loaded in this process only when a
        # search runs here (the CLI, the benches). The gateway searches in its
        # search process and never loads it: ~150 MiB of weights saved.
        self._embedder: Embedder | Literal["lazy"] | None = embedder
        self._embedder_lock = threading.Lock()
        self._embedding_worker = embedding_worker
        # One search thread: searches are short, and a single worker bounds the CPU
        # memory search can take from the proxy on a small machine.
        self._search_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lore-search")
        self._searcher: Searcher | None = None
        self._searches: SearchProcess | None = None
        self._closed = False
        self._reader: Connection | None = None
        self._reader_lock = threading.Lock()
        self._backfill: threading.Thread | None = None

    @classmethod
    def open(cls, settings: Settings, *,
             embedder: Embedder | Literal["auto"] | None = "auto",
             embed_backlog: bool = True, turn_process: bool = False) -> Memory:
        """Open (creating and migrating) ``settings.database`` and start the workers.

        ``embedder="auto"`` loads the offline MiniLM model when ``settings.embeddings``
        is on and the weights are installed; ``None`` means BM25 only (the CLI's
        browsing commands use that to start fast). ``embed_backlog=False`` skips the
        background embedding process: a one-off search (``lore recall``) only embeds
        its query. ``turn_process=True`` writes turns in a child process
        (``store_process``: the gateway, so storage never takes its GIL).
        """
        made = _open_parts(settings, embedder, embed_backlog, turn_process)
        memory = cls(settings, writer=made.writer, embedder=made.embedder,
                     embedding_worker=made.embedding_worker, turn_store=made.turn_store)
        memory._start_backfill()
        return memory

    @property
    def traffic(self) -> TrafficClock | None:
        """Where the proxy marks its requests, so the embedding backlog can wait
        for a quiet moment (memory/store/traffic.py); ``None`` without that process."""
        return self._embedding_worker.traffic if self._embedding_worker is not None else None

    @property
    def embeddings(self) -> bool:
        """Whether search is hybrid (the model is installed and on), without loading it."""
        return self._embedder is not None

    @property
    def embedder(self) -> Embedder | None:
        """The in-process embedder, loaded on first use (``None``: BM25 only)."""
        with self._embedder_lock:
            if self._embedder == "lazy":
                from lore_gateway.memory.embed.embedder import load_embedder

                self._embedder = load_embedder()
            return self._embedder

    def _start_backfill(self) -> None:
        """Queue stored messages that have no vector (written while the model was
        absent, or dropped from a full queue) for the embedding worker.

        On its own thread so start-up never waits for the scan; the worker's queue
        is bounded, and what does not fit waits for the next start.
        """
        worker = self._embedding_worker
        if worker is None:
            return

        def run() -> None:
            try:
                worker.backfill()
            except Exception:
                log.exception("memory: queueing messages without vectors failed; they stay "
                              "BM25-only until the next start")

        self._backfill = threading.Thread(target=run, name="lore-embed-backfill", daemon=True)
        self._backfill.start()

    # --- identity and the write path -----------------------------------------------

    def identify(self, protocol: str, headers: Mapping[str, str],
                 body: Mapping[str, Any]) -> Identity:
        """Tenant, project and session of a request (``headers`` lower-cased), made
        storable: a client-chosen session id may hold a lone surrogate or NUL.

        Raises ``GatewayError`` (401) in team mode when the request has no valid key.
        """
        found = identity.identify(protocol, headers, body, tenancy=self.tenancy)
        return Identity(storable(found.tenant), storable(found.project), storable(found.session))

    def begin_turn(self, ident: Identity, *, protocol: str, model: str | None,
                   inputs: Sequence[Message], side_channel: str | None = None) -> PendingTurn:
        return PendingTurn(self, ident, protocol, model, inputs, side_channel)

    def submit_turn(self, turn: TurnRecord | RawTurn, *, wait: bool = False) -> bool:
        """Queue a turn for the writer thread; ``False`` when not queued (storage
        disabled, queue full, or closed). Never blocks unless ``wait=True``, which
        imports and benchmarks use for back-pressure (the proxy never does)."""
        if not self.settings.store:
            return False
        if self._turn_store is not None:
            return self._turn_store.submit(turn, wait=wait)
        return self._writer.submit(turn, wait=wait)

    @property
    def writer(self) -> TurnWriter:
        """The writer thread; other stores (recall anchors) queue jobs on it."""
        return self._writer

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted turn is written (and, with embeddings, embedded)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._turn_store is not None and not self._turn_store.flush(timeout):
            raise TimeoutError(f"memory storage process still busy after {timeout} s")
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._writer.flush(remaining):
            raise TimeoutError(f"memory writer still busy after {timeout} s")
        if self._backfill is not None:
            self._backfill.join(None if deadline is None
                                else max(0.0, deadline - time.monotonic()))
        if self._embedding_worker is not None:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._embedding_worker.flush(remaining)

    @property
    def embedding_progress(self) -> tuple[int, int] | None:
        """(messages embedded, messages submitted) by this process; None without a model."""
        worker = self._embedding_worker
        if worker is None:
            return None
        return worker.progress + worker.dropped, worker.submitted

    @property
    def _turns(self) -> TurnWriter | TurnStoreProcess:
        return self._turn_store if self._turn_store is not None else self._writer

    @property
    def queue_depth(self) -> int:
        return self._turns.queue_depth

    def backlogged(self, in_flight: int) -> bool:
        """Whether ``in_flight`` more turns might not fit in the writer's queue
        (the proxy then holds new requests back rather than drop turns later)."""
        turns = self._turns
        return turns.queue_depth > turns.capacity - in_flight

    @property
    def dropped_turns(self) -> int:
        dropped = self._writer.dropped
        if self._turn_store is not None:
            dropped += self._turn_store.dropped
        return dropped

    @property
    def degraded(self) -> str | None:
        """Why memory is not fully working right now, or None when it is."""
        for writer in (self._writer, self._turn_store):
            if writer is not None and writer.degraded is not None:
                return writer.degraded
        worker = self._embedding_worker
        if worker is not None and worker.degraded is not None:
            return worker.degraded
        return None

    @property
    def written_turns(self) -> int:
        """Turns written by this process (imports report new vs. already stored)."""
        return self._turns.written

    @property
    def skipped_turns(self) -> int:
        """Turns not written: empty after cleaning, or their dedup key already stored."""
        return self._turns.skipped

    # --- search and detail ---------------------------------------------------------

    def search_sync(self, query: str, *, identity: Identity, scope: str = "all",
                    limit: int = 10) -> SearchResult:
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        return self._get_searcher().search(
            query, tenant=identity.tenant, project=identity.project, session=identity.session,
            scope=scope, limit=limit,
        )

    async def search(self, query: str, *, identity: Identity, scope: str = "all",
                     limit: int = 10) -> SearchResult:
        """A search for the event loop: in the search process when it is on (the
        gateway), else on the search thread. Raises ``MemoryUnavailable`` (or its
        ``SearchTimeout``) when memory cannot answer in time."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        searcher = self._search_process()
        if searcher is not None:
            return await searcher.search(query, tenant=identity.tenant,
                                         project=identity.project, session=identity.session,
                                         scope=scope, limit=limit)
        future = asyncio.get_running_loop().run_in_executor(self._search_pool, lambda: (
            self.search_sync(query, identity=identity, scope=scope, limit=limit)))
        try:
            async with asyncio.timeout(self.settings.search_timeout):
                return await future
        except TimeoutError:
            raise SearchTimeout(
                f"memory search took longer than {self.settings.search_timeout:g} s") from None

    def _search_process(self) -> SearchProcess | None:
        if not self.settings.search_process:
            return None
        if self._closed:
            raise MemoryUnavailable("memory is closed")
        if self._searches is None:
            from lore_gateway.memory.search.process import SearchProcess

            # search_workers 0: the embedding process answers searches too.
            host = self._embedding_worker if self.settings.search_workers == 0 else None
            self._searches = SearchProcess(self.database,
                                           embeddings=self.embeddings,
                                           workers=self.settings.search_workers,
                                           timeout=self.settings.search_timeout,
                                           host=host, rerank=self.settings.rerank)
        return self._searches

    def warm_search(self) -> None:
        """Start the search process now, so the first recall does not wait for it."""
        searcher = self._search_process()
        if searcher is not None:
            searcher.warm()

    def render(self, result: SearchResult, budget_chars: int = 12_000) -> str:
        from lore_gateway.memory.search.render import render

        return render(result, budget_chars=budget_chars)

    def detail_sync(self, ref: str, *, tenant: str, offset: int = 0,
                    limit: int = catalog.DETAIL_DEFAULT_CHARS) -> str:
        return self._read(lambda conn: catalog.detail_text(conn, ref, tenant, offset, limit))

    async def detail(self, ref: str, *, tenant: str, offset: int = 0,
                     limit: int = catalog.DETAIL_DEFAULT_CHARS) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._search_pool,
            lambda: self.detail_sync(ref, tenant=tenant, offset=offset, limit=limit),
        )

    def _get_searcher(self) -> Searcher:
        # Imported on first use: browsing commands never pay for the search stack.
        if self._searcher is None:
            from lore_gateway.memory.search.searcher import Searcher

            reranker = None
            if self.settings.rerank:
                from lore_gateway.memory.search.rerank import load_reranker

                reranker = load_reranker()
            self._searcher = Searcher(self._conn_factory, self.embedder, reranker)
        return self._searcher

    # --- browsing and housekeeping (the CLI) ---------------------------------------

    def tenants(self) -> list[catalog.TenantSummary]:
        return self._read(catalog.tenants)

    def sessions(self, tenant: str | None, *,
                 project: str | None = None) -> list[catalog.SessionSummary]:
        return self._read(lambda conn: catalog.sessions(conn, tenant, project=project))

    def session_messages(self, tenant: str | None, session: str) -> list[catalog.StoredMessage]:
        return self._read(lambda conn: catalog.session_messages(conn, tenant, session))

    def count_turns(self, tenant: str | None, *, session: str | None = None,
                    project: str | None = None) -> int:
        return self._read(
            lambda conn: catalog.count_turns(conn, tenant, session=session, project=project))

    def delete(self, tenant: str | None, *, session: str | None = None,
               project: str | None = None, progress: catalog.Progress | None = None) -> int:
        """Delete one session's or project's turns on the writer thread; the turn count.
        What was distilled or learned from them goes too (``distill.store.forget``)."""
        from lore_gateway.distill.store import forget

        def run(conn: Connection) -> int:
            count = catalog.delete_turns(conn, tenant, session=session, project=project,
                                         progress=progress)
            forget(conn, tenant, session=session, project=project)
            return count

        return self._job(run)

    def write_job(self, run: Callable[[Connection], T]) -> T:
        """Run ``run(conn)`` on the writer thread, behind every queued turn (blocks:
        call it from a thread). Background jobs (distillation, knowledge) write here
        so the gateway keeps one writer thread."""
        return self._job(run)

    def _job(self, run: Callable[[Connection], T]) -> T:
        if self._turn_store is not None:
            self._turn_store.flush()  # behind every turn submitted so far
        return self._writer.run_job(run)

    def read(self, query: Callable[[Connection], T]) -> T:
        """Run ``query(conn)`` on the shared read connection (blocks)."""
        return self._read(query)

    def _read(self, query: Callable[[Connection], T]) -> T:
        with self._reader_lock:
            if self._reader is None:
                self._reader = db.connect(self.database)
            return query(self._reader)

    def close(self) -> None:
        """Write everything queued, stop the workers, close connections."""
        self._closed = True
        if self._turn_store is not None:
            self._turn_store.close()
        self._writer.close()
        if self._keyring is not None:
            self._keyring.close()
        if self._backfill is not None:
            self._backfill.join(timeout=5)
        if self._embedding_worker is not None:
            self._embedding_worker.close(timeout=3.0)
        if self._searches is not None:
            self._searches.close()
        self._search_pool.shutdown(wait=True)
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None


@dataclass(frozen=True, slots=True)
class _Parts:
    writer: TurnWriter
    embedder: Embedder | Literal["lazy"] | None
    embedding_worker: EmbeddingProcess | None
    turn_store: TurnStoreProcess | None


def _open_parts(settings: Settings, embedder: Embedder | Literal["auto"] | None,
                embed_backlog: bool, turn_process: bool) -> _Parts:
    """What ``Memory.open`` builds before the facade: the migrated database, the
    embedder wanted, the embedding process, the writer and the storage process."""
    database = settings.database
    conn = db.connect(database)
    try:
        schema.migrate(conn, index_memory_mb=settings.database_index_memory_mb)
    finally:
        conn.close()
    wanted: Embedder | Literal["lazy"] | None = None
    if embedder == "auto":
        if settings.embeddings:
            from lore_gateway.memory.embed.model_files import model_info, warn_model_missing

            if model_info() is not None:
                wanted = "lazy"
            else:
                warn_model_missing()
    else:
        wanted = embedder
    worker: EmbeddingProcess | None = None
    if wanted is not None and embed_backlog:
        from lore_gateway.memory.embed.process import EmbeddingProcess

        worker = EmbeddingProcess(database, rerank=settings.rerank)
    writer = TurnWriter(
        db.conn_factory(database),
        max_message_bytes=settings.store_max_message_bytes,
        on_commit=worker.submit if worker is not None else None,
    )
    turn_store = None
    if turn_process:
        from lore_gateway.memory.store.process import TurnStoreProcess

        turn_store = TurnStoreProcess(
            database, max_message_bytes=settings.store_max_message_bytes,
            on_commit=worker.submit if worker is not None else None)
    return _Parts(writer, wanted, worker, turn_store)
