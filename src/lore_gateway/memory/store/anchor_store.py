"""The recalls a client transcript points at, kept for next-turn expansion (lore-spec B.6).

Where a hidden recall happened the client holds only an anchor. On the next request
the gateway puts back the exact pair the follow-up sent upstream (a
``function_call`` + ``function_call_output``, a ``tool_use`` + ``tool_result``, or
an assistant ``tool_calls`` + ``tool`` message). This module keeps those pairs:

* per (tenant, session), keyed by anchor id;
* verbatim: the two upstream objects are kept as the JSON bytes orjson wrote for
  the follow-up, so expansion re-serialises them byte for byte and the provider's
  prompt cache keeps hitting;
* persisted in the memory database (table ``recall_anchors``), because a restart
  that forgets them turns every marker into raw text upstream (lore-spec I.14);
* bounded: at most 128 entries and 1 MiB per session (B.6), and a bounded LRU of
  cached sessions in memory, loaded lazily from the database;
* shared: gateways on one database serve the same sessions (a load balancer may
  send each turn elsewhere), so a cached session that lacks an anchor the
  request carries is re-read from the database once; an anchor found nowhere
  is remembered as absent until the session is next re-read.

All database work (loads and writes) runs as jobs on the memory's one writer
thread (``TurnWriter.submit_job``), in submission order, so a session loaded after
a commit always sees that commit, there is no second writer to contend with, and
the event loop never waits on SQLite.

Credentials are redacted in what reaches the database (lore-spec: nothing a user
typed is stored verbatim if it looks like a key), as in stored messages. The
cached copy stays verbatim, so within one process a replay is byte-identical; after
a restart a pair that held a key replays redacted, a rare and logged rewrite.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from lore_gateway.memory.store.sanitize import redact_credentials
from lore_gateway.memory.store.writer import TurnWriter
from lore_gateway.storage import db
from lore_gateway.storage.base import Connection, Database

log = logging.getLogger("lore.recall")

T = TypeVar("T")

# lore-spec B.6: per-session capacity of the recall store.
MAX_ENTRIES_PER_SESSION = 128
MAX_BYTES_PER_SESSION = 1024 * 1024
# Sessions kept in memory. Evicting one loses nothing (it is in the database); the
# bound keeps a gateway serving many agents from holding every session's recalls.
# 8 MiB keeps eight sessions at their 1 MiB capacity: at 32 MiB, 100 recalling
# agents took two minutes to fill it, and the gateway's RSS grew 16.5% after the
# soak's first minute (7.7% at 8 MiB, docs/reliability.md). A session evicted is
# read back once, on the writer thread.
MAX_CACHED_SESSIONS = 256
MAX_CACHED_BYTES = 8 * 1024 * 1024
# Session loads started for commits. A recall is stored once per delivered
# answer, so this is only reached when the disk has stalled for a long time.
MAX_PENDING_WRITES = 1_000
# What an anchor store opened on a bare path (tests, tools) lets its own writer
# keep per stored field; the gateway's store shares the memory's writer.
_OWN_WRITER_MESSAGE_BYTES = 1024 * 1024
CAPACITY_EXCEEDED = "recall store capacity exceeded"
# Anchors remembered per session as absent from the database (copied from
# another conversation, or evicted): each would otherwise re-read the session.
MAX_ABSENT_PER_SESSION = 1_024
# Closing waits this long for queued anchor writes: the writer's own close then
# finishes them, so a stalled disk delays shutdown by this much at most here.
CLOSE_TIMEOUT_S = 30.0

SessionKey = tuple[str, str]  # (tenant, session)


class RecallStoreFull(Exception):
    """A session's recall store cannot take another entry without evicting one the
    client still refers to."""


@dataclass(frozen=True, slots=True)
class StoredRecall:
    """One recall as the follow-up sent it upstream.

    ``assistant_json`` and ``result_json`` are the exact serialisations of the two
    objects the follow-up appended (for Responses, the ``function_call`` and the
    ``function_call_output`` items). ``context_id`` fingerprints the conversation
    the recall belongs to (``anchor_context.prefix_context_id``).
    """

    anchor_id: str
    protocol: str  # "responses" | "anthropic" | "chat": the family of the wire format
    marker: str | None
    call_id: str
    arguments: str
    position: int
    context_id: str
    assistant_json: bytes
    result_json: bytes
    created_at: float

    @classmethod
    def from_messages(cls, *, anchor_id: str, protocol: str, marker: str | None,
                      call_id: str, arguments: str, position: int, context_id: str,
                      assistant: dict[str, Any], tool_result: dict[str, Any]) -> StoredRecall:
        return cls(anchor_id, protocol, marker, call_id, arguments, position, context_id,
                   _compact_json(assistant), _compact_json(tool_result), time.time())

    @property
    def assistant(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.assistant_json)
        return value

    @property
    def tool_result(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.result_json)
        return value

    @property
    def redacted(self) -> StoredRecall:
        """This entry as it may be written to disk: credentials redacted."""
        return StoredRecall(
            self.anchor_id, self.protocol, self.marker, self.call_id,
            redact_credentials(self.arguments), self.position, self.context_id,
            _redact_json(self.assistant_json), _redact_json(self.result_json),
            self.created_at)

    @property
    def size(self) -> int:
        """What the entry counts against the per-session byte capacity."""
        return (len(self.assistant_json) + len(self.result_json) + len(self.arguments)
                + len(self.marker or "") + len(self.call_id) + 128)


@dataclass(slots=True)
class SessionRecalls:
    """The recalls of one session, with the use order eviction needs.

    ``last_used`` holds a stamp per anchor: its creation, raised each time an
    expansion finds it. An entry found by the session's latest expansion, or
    created since, is live (the client's transcript still shows its anchor) and
    is never evicted; older ones are stale.
    """

    entries: dict[str, StoredRecall] = field(default_factory=dict)
    last_used: dict[str, int] = field(default_factory=dict)
    latest_expansion: int = 0
    bytes: int = 0
    # Anchors a request carried that the database did not hold at the last read.
    absent: set[str] = field(default_factory=set)

    def lacks(self, anchor_ids: Iterable[str]) -> bool:
        """Whether any of these anchors is neither here nor known to be absent."""
        return any(a not in self.entries and a not in self.absent for a in anchor_ids)

    def get(self, anchor_id: str) -> StoredRecall | None:
        return self.entries.get(anchor_id)

    def __len__(self) -> int:
        return len(self.entries)

    def touch(self, anchor_ids: Iterable[str]) -> None:
        """Mark these anchors as found in the session's latest expansion (live)."""
        stamp = next(_stamps)
        found = False
        for anchor_id in anchor_ids:
            if anchor_id in self.entries:
                self.last_used[anchor_id] = stamp
                found = True
        if found:
            self.latest_expansion = stamp


_stamps = itertools.count(1)


def _note_absent(recalls: SessionRecalls, wanted: Iterable[str]) -> None:
    for anchor_id in wanted:
        if anchor_id not in recalls.entries and len(recalls.absent) < MAX_ABSENT_PER_SESSION:
            recalls.absent.add(anchor_id)


def _compact_json(value: dict[str, Any]) -> bytes:
    """``orjson.dumps(value)`` in a bytes object of its own length.

    orjson returns its 4 KiB write buffer with the length set short, so a 108-byte
    entry kept 4 KiB resident: each cached recall held ~9 KiB against the ~0.5 KiB
    its ``size`` counts, and the cache's byte bounds never applied (the soak's
    gateway grew ~5 KB per stored turn). A copy is exact.
    """
    return memoryview(orjson.dumps(value)).tobytes()


def _redact_json(raw: bytes) -> bytes:
    """Redact inside serialised JSON; the redaction keeps string syntax intact."""
    text = raw.decode()
    cleaned = redact_credentials(text)
    return raw if cleaned is text else cleaned.encode()


class AnchorStore:
    """Recalls per (tenant, session): an in-memory LRU over a database table."""

    def __init__(self, db_path: Database | Path | None = None, *,
                 writer: TurnWriter | None = None,
                 max_entries: int = MAX_ENTRIES_PER_SESSION,
                 max_bytes: int = MAX_BYTES_PER_SESSION,
                 max_sessions: int = MAX_CACHED_SESSIONS,
                 max_cached_bytes: int = MAX_CACHED_BYTES) -> None:
        """``writer``: the memory's writer (the gateway); or ``db_path``: a store of
        its own on that database (tools, tests); neither: a cache only."""
        self._own_writer = writer is None and db_path is not None
        if writer is None and db_path is not None:
            writer = TurnWriter(db.conn_factory(db_path),
                                max_message_bytes=_OWN_WRITER_MESSAGE_BYTES)
        self._writer = writer
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._max_sessions = max_sessions
        self._max_cached_bytes = max_cached_bytes
        self._cache: OrderedDict[SessionKey, SessionRecalls] = OrderedDict()
        self._cached_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writes: set[Future[None]] = set()
        # Commits for sessions not cached yet, applied when their load lands.
        self._unloaded: dict[SessionKey, list[StoredRecall]] = {}
        self.dropped_writes = 0

    @property
    def cached_sessions(self) -> int:
        return len(self._cache)

    # --- reads (event loop) ----------------------------------------------------------

    async def session(self, tenant: str, session: str,
                      wanted: Iterable[str] = ()) -> SessionRecalls:
        """The session's recalls, from the cache or (once) from the database.

        ``wanted``: the anchors the request carries. A cached session lacking
        one of them is re-read (another gateway on the same database may have
        stored it), and what the database adds is merged into the cache.
        """
        key = (tenant, session)
        wanted = tuple(wanted)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            if self._writer is None or not cached.lacks(wanted):
                return cached
            loaded = await self._run(lambda conn: _read_session(conn, key))
            self._merge(key, cached, loaded, wanted)
            return cached
        loaded = await self._run(lambda conn: _read_session(conn, key))
        # Another request may have loaded (or committed to) it meanwhile.
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        _note_absent(loaded, wanted)
        self._remember(key, loaded)
        return loaded

    def _merge(self, key: SessionKey, cached: SessionRecalls, loaded: SessionRecalls,
               wanted: tuple[str, ...]) -> None:
        """Add the recalls another instance stored to a cached session. Cached
        entries win: they are verbatim, the database's are redacted."""
        cached.absent.clear()
        added = 0
        for anchor_id, entry in loaded.entries.items():
            if anchor_id not in cached.entries:
                self._add(cached, entry)
                added += entry.size
        if key in self._cache:
            self._cached_bytes += added
        _note_absent(cached, wanted)
        self._trim_cache()

    def touch(self, recalls: SessionRecalls, anchor_ids: Iterable[str]) -> None:
        """Mark these anchors as found in the session's latest expansion (live)."""
        recalls.touch(anchor_ids)

    # --- writes ---------------------------------------------------------------------

    def commit(self, tenant: str, session: str, new: list[StoredRecall]) -> None:
        """Add delivered recalls to the session; persisted on the store thread.

        Call on the event loop. A cached session is updated at once, so the very
        next request can expand the anchors before the database write lands; for
        an uncached one the recalls wait until its load lands (started here if
        no request started it), so no load ever caches a session without them.

        Raises :class:`RecallStoreFull` (nothing added) when a cached session
        cannot take the recalls without evicting a live entry (for an uncached
        one this is logged); stale entries (not seen in the latest expansion) are
        evicted oldest first, with a log line.
        """
        if not new:
            return
        key = (tenant, session)
        recalls = self._cache.get(key)
        if recalls is not None:
            self._commit_cached(key, recalls, new)
            return
        waiting = self._unloaded.setdefault(key, [])
        waiting.extend(new)
        if len(waiting) > len(new):
            return  # a load that will apply them is already under way
        if len(self._tasks) >= MAX_PENDING_WRITES:
            self._unloaded.pop(key, None)
            self.dropped_writes += 1
            log.warning("recall store: too many sessions loading; a recall is not kept")
            return
        task = asyncio.get_running_loop().create_task(self._load_for_commit(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_for_commit(self, key: SessionKey) -> None:
        """Load a session so the commits waiting for it are applied (in ``_remember``)."""
        try:
            await self.session(*key)
        except Exception as exc:  # a background task: report, never raise into the loop
            self._unloaded.pop(key, None)
            log.error("recall store load failed: %s: %s", type(exc).__name__, exc)

    def _commit_cached(self, key: SessionKey, recalls: SessionRecalls,
                       new: list[StoredRecall]) -> None:
        evicted = self._make_room(recalls, new)
        for entry in new:
            self._add(recalls, entry)
        self._cached_bytes += sum(e.size for e in new) - sum(e.size for e in evicted)
        self._cache.move_to_end(key)
        self._trim_cache()
        self._submit_write(key, new, [e.anchor_id for e in evicted])

    async def drain(self) -> None:
        """Wait for commits still loading their session, then for every write."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self._run(lambda conn: None)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write submitted so far is in the database."""
        if self._writer is not None:
            self._writer.flush(timeout)

    def close(self) -> None:
        """Finish queued writes; a store with its own writer also stops it (the
        memory's writer is the memory's to close)."""
        if self._writer is None:
            return
        if not self._writer.flush(CLOSE_TIMEOUT_S):
            log.warning("recall store: writes still queued after %.0f s at close", CLOSE_TIMEOUT_S)
        if self._own_writer:
            self._writer.close()

    # --- internals -------------------------------------------------------------------

    def _make_room(self, recalls: SessionRecalls, new: list[StoredRecall]) -> list[StoredRecall]:
        need_entries = len(recalls) + len(new) - self.max_entries
        need_bytes = recalls.bytes + sum(e.size for e in new) - self.max_bytes
        if sum(e.size for e in new) > self.max_bytes or len(new) > self.max_entries:
            raise RecallStoreFull(CAPACITY_EXCEEDED)
        if need_entries <= 0 and need_bytes <= 0:
            return []
        stale = sorted(
            (a for a in recalls.entries
             if recalls.last_used.get(a, 0) < recalls.latest_expansion),
            key=lambda a: recalls.last_used.get(a, 0),
        )
        chosen: list[StoredRecall] = []
        for anchor_id in stale:
            if need_entries <= 0 and need_bytes <= 0:
                break
            entry = recalls.entries[anchor_id]
            chosen.append(entry)
            need_entries -= 1
            need_bytes -= entry.size
        if need_entries > 0 or need_bytes > 0:
            raise RecallStoreFull(CAPACITY_EXCEEDED)
        for entry in chosen:
            del recalls.entries[entry.anchor_id]
            recalls.last_used.pop(entry.anchor_id, None)
            recalls.bytes -= entry.size
        log.warning("recall store full: evicted %d stale recall(s) of a session",
                    len(chosen))
        return chosen

    @staticmethod
    def _add(recalls: SessionRecalls, entry: StoredRecall) -> None:
        previous = recalls.entries.get(entry.anchor_id)
        if previous is not None:
            recalls.bytes -= previous.size
        recalls.entries[entry.anchor_id] = entry
        recalls.last_used[entry.anchor_id] = next(_stamps)
        recalls.bytes += entry.size

    def _remember(self, key: SessionKey, recalls: SessionRecalls) -> None:
        """Cache a loaded session, applying the commits that waited for it."""
        self._cache[key] = recalls
        self._cached_bytes += recalls.bytes
        waiting = self._unloaded.pop(key, None)
        if waiting:
            try:
                self._commit_cached(key, recalls, waiting)
            except RecallStoreFull as exc:
                log.warning("recall store: %s; %d recall(s) will not be replayed",
                            exc, len(waiting))
        self._trim_cache()

    def _trim_cache(self) -> None:
        while len(self._cache) > 1 and (len(self._cache) > self._max_sessions
                                        or self._cached_bytes > self._max_cached_bytes):
            _, dropped = self._cache.popitem(last=False)
            self._cached_bytes -= dropped.bytes

    async def _run(self, run: Callable[[Connection], T]) -> T:
        """``run(conn)`` on the writer thread, awaited; without a database, on a
        fresh empty session (``_read_session`` of nothing)."""
        if self._writer is None:
            return run(_NO_DATABASE)
        future = self._writer.submit_job(run)
        if future is None:
            raise RuntimeError("memory writer queue is full or closed; "
                               "recall anchors cannot be read now")
        return await asyncio.wrap_future(future)

    def _submit_write(self, key: SessionKey, new: list[StoredRecall],
                      evicted: list[str]) -> None:
        if self._writer is None:
            return
        rows = [e.redacted for e in new]
        if len(self._writes) >= MAX_PENDING_WRITES:
            self.dropped_writes += 1
            log.warning("recall store: %d writes pending; dropping one (%d dropped)",
                        len(self._writes), self.dropped_writes)
            return
        future = self._writer.submit_job(lambda conn: _write(conn, key, rows, evicted))
        if future is None:
            self.dropped_writes += 1
            log.warning("recall store: the memory writer is full or closed; a recall is "
                        "not kept (%d dropped)", self.dropped_writes)
            return
        self._writes.add(future)
        future.add_done_callback(self._write_done)

    def _write_done(self, future: Future[None]) -> None:
        self._writes.discard(future)
        _log_failure(future)


def _log_failure(future: Future[None]) -> None:
    exc = future.exception()
    if exc is None:
        return
    log.error("recall store write failed: %s: %s", type(exc).__name__, exc)


_COLUMNS = ("anchor_id, protocol, marker, call_id, arguments, position, context_id, "
            "assistant, tool_result, created_at")
# A recall stored again replaces the row (an upsert both backends spell alike).
_REPLACE = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[1:])


class _NoDatabase:
    """Stands in for a connection when the store has no database: reads find nothing."""

    def execute(self, *_: object) -> _NoDatabase:
        return self

    def fetchall(self) -> list[tuple[object, ...]]:
        return []

    def tenant_scope(self, tenant: str) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


_NO_DATABASE: Any = _NoDatabase()


def _read_session(conn: Connection, key: SessionKey) -> SessionRecalls:
    recalls = SessionRecalls()
    with conn.tenant_scope(key[0]):
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM recall_anchors WHERE tenant = ? AND session = ? "
            "ORDER BY created_at", key).fetchall()
    for row in rows:
        values: list[Any] = list(row)
        try:
            entry = StoredRecall(
                str(values[0]), str(values[1]),
                values[2] if isinstance(values[2], str) else None,
                str(values[3]), str(values[4]), int(values[5]), str(values[6]),
                str(values[7]).encode(), str(values[8]).encode(), float(values[9]))
        except (TypeError, ValueError):
            log.warning("recall store: skipped a damaged row")
            continue
        AnchorStore._add(recalls, entry)
    return recalls


def _write(conn: Connection, key: SessionKey, new: list[StoredRecall],
           evicted: list[str]) -> None:
    with conn.tenant_scope(key[0]), conn:
        _write_rows(conn, key, new, evicted)


def _write_rows(conn: Connection, key: SessionKey, new: list[StoredRecall],
                evicted: list[str]) -> None:
    tenant, session = key
    for anchor_id in evicted:
        conn.execute("DELETE FROM recall_anchors WHERE tenant = ? AND session = ? "
                     "AND anchor_id = ?", (tenant, session, anchor_id))
    for e in new:
        conn.execute(
            f"INSERT INTO recall_anchors(tenant, session, {_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (tenant, session, anchor_id) DO UPDATE SET " + _REPLACE,
            (tenant, session, e.anchor_id, e.protocol, e.marker, e.call_id, e.arguments,
             e.position, e.context_id, e.assistant_json.decode(), e.result_json.decode(),
             e.created_at))
