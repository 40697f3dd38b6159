"""The single writer: one thread owns every write to the memory database.

The proxy must never wait on storage, so it hands finished turns to a bounded
queue (``submit`` never blocks) and this thread writes them. Each turn is atomic:
it is written whole inside its own savepoint or not at all. When turns queue up,
several whole turns share one commit, which is what lets an import or a benchmark
write hundreds of thousands of turns without one fsync-bound commit each.

Deletions and other maintenance run on the same thread as *jobs*, so there is
never a second writer inside this process to contend with.

The writer cannot die silently. A turn that cannot be written is logged (never
its content) and skipped; anything that escapes a batch makes the thread's own
supervisor loop reconnect and go on after a short back-off, and ``degraded``
says why while it does, for ``/health``. ``submit`` restarts a thread that is
gone although nobody closed it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from lore_gateway.memory.db import ConnFactory
from lore_gateway.memory.errors import StorageBusy, StorageError, StorageUnavailable
from lore_gateway.memory.identity import UNKNOWN_PROJECT
from lore_gateway.memory.records import Identity, RawTurn, TurnRecord
from lore_gateway.memory.sanitize import clean_for_storage, storable
from lore_gateway.privacy import redact_turn
from lore_gateway.storage.base import Connection, Cursor

log = logging.getLogger(__name__)

# 10,000 queued turns is minutes of traffic from every agent on a workstation; if
# the disk stalls longer than that, dropping (and counting) beats unbounded memory.
DEFAULT_MAX_QUEUE = 10_000
# Turns per commit when a backlog exists. Large enough to amortise the commit,
# small enough that a reader never waits long behind the write lock.
MAX_TURNS_PER_COMMIT = 256
# Token estimate: about three characters per token for mixed prose and code
# (the reference gateway's rule, lore-spec A.5). Cheap, and close enough to budget by.
CHARS_PER_TOKEN = 3
# While the queue overflows, one warning per interval (with the running count)
# rather than one per dropped turn, which would flood the log exactly when the
# machine is already struggling.
DROP_WARNING_INTERVAL_S = 10.0
# Back-off of the supervisor loop after an unexpected error: long enough not to
# spin on a broken disk, short enough that memory is back within seconds.
RESTART_BACKOFF_S = (0.1, 0.5, 2.0, 5.0)
# While the database cannot be reached (Postgres restarting, a cut network), a batch
# is kept and retried after these pauses (the last one repeats): turns wait in the
# bounded queue instead of being dropped. Stopping gives up after CLOSING_ATTEMPTS.
UNREACHABLE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
CLOSING_ATTEMPTS = 2
# The roles of a turn's client-side input; the assistant's output is everything else.
INPUT_ROLES = ("user", "tool")

T = TypeVar("T")


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(slots=True)
class _Job(Generic[T]):
    run: Callable[[Connection], T]
    future: Future[T]


_STOP = object()
# A turn that could not be written (``TurnWriter._write_one``).
FAILED = object()


def _count_stored(count: int) -> None:
    from lore_gateway.obs import metrics

    metrics.record_stored_turns(count)


class TurnWriter:
    """Owns the write connection and the queue that feeds it."""

    def __init__(
        self,
        connect: ConnFactory,
        *,
        max_message_bytes: int,
        max_queue: int = DEFAULT_MAX_QUEUE,
        on_commit: Callable[[list[int]], None] | None = None,
        on_done: Callable[[int], None] | None = None,
        on_stored: Callable[[int], None] | None = None,
        group_wait_s: float = 0.0,
    ) -> None:
        """``on_commit(ids)``: the message ids of each commit (the embedder's feed),
        called before the batch counts as done, so a ``flush`` that returns has
        handed them on. ``on_done(count)``: after ``count`` items were processed
        (the storage process reports progress to the gateway with it).
        ``on_stored(count)``: the turns each commit stored; by default the
        gateway's ``/metrics`` counter (the storage process passes its own: its
        gateway counts what it reports, and the child never imports
        prometheus-client, 8 MiB of RSS). ``group_wait_s``: how long a turn that
        finds the queue empty waits for more turns to share its commit (0: none;
        a ``flush``, a job or ``close`` ends the wait at once)."""
        self._connect = connect
        self._max_message_bytes = max_message_bytes
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self._on_commit = on_commit
        self._on_done = on_done
        self._on_stored = on_stored or _count_stored
        self._group_wait_s = group_wait_s
        # Ends a batch's wait for company early: a flush, a job, a stop, a full
        # batch. An event rather than the queue's own wake-up, which would wake
        # the writer for every turn that arrives while it waits.
        self._hurry = threading.Event()
        self._progress = threading.Condition()
        self._submitted = 0
        self._processed = 0
        self.written = 0
        self.dropped = 0
        self.failed = 0
        self.skipped = 0
        self.restarts = 0
        self.last_error: str | None = None
        # Why memory is not being written right now (None: healthy).
        self.degraded: str | None = None
        self._closing = False
        self._last_drop_warning = -DROP_WARNING_INTERVAL_S
        self._thread = self._start_thread()

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="lore-memory-writer", daemon=True)
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error
        return thread

    # --- caller side ---------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def capacity(self) -> int:
        return self._queue.maxsize

    def submit(self, turn: TurnRecord | RawTurn, *, wait: bool = False) -> bool:
        """Queue a turn; ``False`` (and a warning) when the queue is full or closed.

        ``wait=True`` blocks until there is room instead: back-pressure for imports
        and benchmarks, never for the proxy.
        """
        if wait:
            with self._progress:
                self._submitted += 1
            self._queue.put(turn)
            self._queued()
            return True
        if not self._put(turn):
            return False
        self._queued()
        return True

    def _queued(self) -> None:
        """With a full batch queued, a batch waiting for company stops waiting."""
        if self._group_wait_s and self._queue.qsize() >= MAX_TURNS_PER_COMMIT:
            self._hurry.set()

    def run_job(self, run: Callable[[Connection], T], timeout: float | None = None) -> T:
        """Run ``run(conn)`` on the writer thread and wait for its result.

        For maintenance (deletions); it waits behind every turn already queued.
        """
        future: Future[T] = Future()
        job = _Job(run, future)
        # A job is an explicit request from a CLI user: wait for room rather than drop.
        with self._progress:
            self._submitted += 1
        self._queue.put(job, timeout=timeout)
        self._hurry.set()  # a job never waits for a batch's company
        return future.result(timeout)

    def submit_job(self, run: Callable[[Connection], T]) -> Future[T] | None:
        """Queue ``run(conn)`` behind what is queued, without waiting: for small
        writes from the serving path (recall anchors), which must never block the
        event loop. Returns its future, or None when the queue is full or closed
        (counted and logged like a dropped turn)."""
        future: Future[T] = Future()
        if not self._put(_Job(run, future)):
            return None
        self._hurry.set()
        return future

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written; ``False`` on timeout."""
        with self._progress:
            target = self._submitted
            if self._processed >= target:
                return True
            self._hurry.set()
            return self._progress.wait_for(lambda: self._processed >= target, timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Write what is queued, then stop the thread."""
        self._closing = True
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._hurry.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("memory writer did not finish within %.0f s; %d turns still queued",
                        timeout or 0, self._queue.qsize())

    def _put(self, item: object) -> bool:
        if not self._thread.is_alive() and not self._restart():
            log.warning("memory writer is closed; turn not stored")
            self.dropped += 1
            return False
        with self._progress:
            self._submitted += 1
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            with self._progress:
                self._submitted -= 1
            self.dropped += 1
            now = time.monotonic()
            if now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S:
                self._last_drop_warning = now
                log.warning("memory write queue is full (%d turns); turns are not being "
                            "stored (%d dropped so far)", self._queue.maxsize, self.dropped)
            return False
        return True

    def _restart(self) -> bool:
        """Start a new thread when the old one is gone and nobody closed the writer."""
        with self._progress:
            if self._closing:
                return False
            if self._thread.is_alive():
                return True
            log.error("memory writer thread had stopped; restarting it")
            self.restarts += 1
            try:
                self._thread = self._start_thread()
            except Exception as exc:
                self.degraded = f"memory writer cannot open the database: {_brief(exc)}"
                log.error("memory: %s", self.degraded)
                return False
            return True

    # --- writer thread -------------------------------------------------------------

    def _run(self) -> None:
        """The supervisor loop: serve the queue, and after an unexpected error
        reconnect (with back-off) and serve it again, until stopped."""
        try:
            conn = self._connect()
        except BaseException as exc:
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        failures = 0
        while True:
            try:
                self._serve(conn)
                conn.close()
                return
            except Exception as exc:
                self.last_error = _brief(exc)
                self.degraded = f"memory writer failed and is restarting: {self.last_error}"
                self.restarts += 1
                log.exception("memory: the writer failed; restarting it")
            delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
            failures += 1
            time.sleep(delay)
            try:
                conn.close()
            except Exception:
                log.debug("memory: closing the failed writer connection raised", exc_info=True)
            try:
                conn = self._connect()
            except Exception as exc:
                self.degraded = f"memory writer cannot open the database: {_brief(exc)}"
                log.error("memory: %s", self.degraded)
                continue
            self.degraded = None
            failures = 0

    def _serve(self, conn: Connection) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _Job):
                self._run_job(conn, item)
                continue
            batch = [item]
            stop_after = False
            pending_job: _Job[Any] | None = None
            if self._group_wait_s and self._queue.qsize() < MAX_TURNS_PER_COMMIT:
                self._hurry.wait(self._group_wait_s)
            self._hurry.clear()
            while len(batch) < MAX_TURNS_PER_COMMIT:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop_after = True
                    break
                if isinstance(nxt, _Job):
                    pending_job = nxt
                    break
                batch.append(nxt)
            self._write_batch(conn, batch)
            if pending_job is not None:
                self._run_job(conn, pending_job)
            if stop_after:
                return

    def _done(self, count: int) -> None:
        with self._progress:
            self._processed += count
            self._progress.notify_all()
        if self._on_done is not None:
            try:
                self._on_done(count)
            except Exception:
                log.exception("memory: the progress hook failed")

    def _run_job(self, conn: Connection, job: _Job[Any]) -> None:
        try:
            job.future.set_result(job.run(conn))
        except BaseException as exc:
            job.future.set_exception(exc)
        finally:
            self._done(1)

    def _write_batch(self, conn: Connection, batch: list[object]) -> None:
        """Write one batch; while the database cannot be reached, keep it and retry."""
        batch = self._resolve(batch)
        if not batch:
            return
        attempt = 0
        while True:
            counters = (self.written, self.skipped, self.failed)
            try:
                self._commit_batch(conn, batch)
            except StorageUnavailable as exc:
                self.written, self.skipped, self.failed = counters
                if self._closing and attempt + 1 >= CLOSING_ATTEMPTS:
                    self.failed += len(batch)
                    log.error("memory: stopping while the database cannot be reached; %d "
                              "turns are not stored (%s)", len(batch), _brief(exc))
                    self._done(len(batch))
                    return
                self.degraded = (f"the memory database cannot be reached; {len(batch)} turns "
                                 f"wait to be written ({_brief(exc)})")
                if attempt == 0:
                    log.error("memory: %s", self.degraded)
                time.sleep(UNREACHABLE_BACKOFF_S[min(attempt, len(UNREACHABLE_BACKOFF_S) - 1)])
                attempt += 1
                continue
            if attempt:
                log.warning("memory: the database answers again; %d waiting turns written",
                            len(batch))
                self.degraded = None
            return

    def _resolve(self, batch: list[object]) -> list[object]:
        """Raw turns parsed into turns (outside the write lock); one with no
        message at all is skipped, as ``PendingTurn`` skips an empty turn."""
        if not any(isinstance(item, RawTurn) for item in batch):
            return batch
        from lore_gateway.collector import resolve_turn

        out: list[object] = []
        for item in batch:
            if isinstance(item, RawTurn):
                try:
                    resolved = resolve_turn(item)
                except Exception as exc:
                    log.error("memory: could not read a turn's output of session %s (%s); "
                              "skipped", storable(item.turn.identity.session[:16]),
                              _brief(exc))
                    self.failed += 1
                    self._done(1)
                    continue
                if resolved is None:
                    self.skipped += 1
                    self._done(1)
                    continue
                item = resolved
            out.append(item)
        return out

    def _commit_batch(self, conn: Connection, batch: list[object]) -> None:
        """One commit of whole turns; raises ``StorageUnavailable`` (nothing committed,
        the batch not counted as done) when the database cannot be reached."""
        message_ids: list[int] = []
        unreachable = committed = False
        try:
            written_before = self.written
            _begin_immediate(conn)
            turns = [item for item in batch if isinstance(item, TurnRecord)]
            assert len(turns) == len(batch)
            if conn.backend == "postgres":
                from lore_gateway.memory.writer_pg import write_turns

                results = write_turns(conn, turns, self._max_message_bytes, self._write_one)
            else:
                results = self._write_sqlite(conn, turns)
            for ids in results:
                if ids is FAILED:
                    self.failed += 1
                elif ids is None:
                    self.skipped += 1
                else:
                    assert isinstance(ids, list)
                    self.written += 1
                    message_ids.extend(ids)
            conn.commit()
            committed = True
            self._on_stored(self.written - written_before)
        except StorageUnavailable:
            unreachable = True
            if conn.in_transaction:
                conn.rollback()
            raise
        except StorageError as exc:
            self.failed += len(batch)
            log.error("memory: a commit of %d turns failed (%s); they are not stored",
                      len(batch), _brief(exc))
            if conn.in_transaction:
                conn.rollback()
            message_ids = []
        finally:
            if not unreachable:
                if committed and message_ids and self._on_commit is not None:
                    try:
                        self._on_commit(message_ids)
                    except Exception:
                        log.exception("memory: the post-commit hook failed")
                self._done(len(batch))

    def _write_sqlite(self, conn: Connection, turns: list[TurnRecord]
                      ) -> list[list[int] | object | None]:
        """The batch's turns in order (runs of them set-wise: ``writer_sqlite``),
        first without a savepoint each: a savepoint makes FTS5 write out its
        pending index rows as a segment of their own, one per turn in both
        indexes, where one commit can write one. Should any turn fail, the batch
        starts over with a savepoint per turn, so that only that turn is lost
        (rare: a turn fails only on malformed data)."""
        from lore_gateway.memory.writer_sqlite import write_turns

        def plain(conn: Connection, turn: TurnRecord) -> list[int] | None:
            return write_turn(conn, turn, self._max_message_bytes)

        try:
            return write_turns(conn, turns, self._max_message_bytes, plain)
        except StorageUnavailable:
            raise
        except Exception:
            conn.rollback()
            _begin_immediate(conn)
        return [self._write_one(conn, turn) for turn in turns]

    def _write_one(self, conn: Connection, turn: TurnRecord) -> list[int] | object | None:
        """One turn in its own savepoint: its message ids, None (nothing to write)
        or ``FAILED`` (logged, never its content; the batch goes on)."""
        try:
            with conn:  # a savepoint: one turn is all or nothing
                return write_turn(conn, turn, self._max_message_bytes)
        except StorageUnavailable:
            raise
        except Exception as exc:
            # Whatever is wrong with this turn must not cost the others.
            log.error("memory: could not store a turn of session %s (%s); skipped",
                      storable(turn.identity.session[:16]), _brief(exc))
            return FAILED


# Attempts at the write lock before a batch fails. Each waits up to the busy
# timeout; only another process (the embedder, a CLI) can hold the lock.
BEGIN_ATTEMPTS = 3


def _begin_immediate(conn: Connection) -> None:
    for attempt in range(BEGIN_ATTEMPTS):
        try:
            conn.begin(immediate=True)
            return
        except StorageBusy:
            if attempt == BEGIN_ATTEMPTS - 1:
                raise
            log.warning("memory: the database was locked by another process; retrying")


def _brief(exc: BaseException) -> str:
    """An exception's type and message, for a log line (no traceback, no content)."""
    text = storable(str(exc))[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _storable_meta(value: Any) -> Any:
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(str(k)): _storable_meta(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_meta(v) for v in value]
    return value


def storable_turn(turn: TurnRecord) -> TurnRecord:
    """The turn with every string made storable (``sanitize.storable``): the one
    place where client text is fixed up for SQLite, applied on the writer thread."""
    ident = turn.identity
    return TurnRecord(
        identity=Identity(storable(ident.tenant), storable(ident.project),
                          storable(ident.session)),
        protocol=storable(turn.protocol),
        model=storable(turn.model) if turn.model is not None else None,
        messages=tuple(type(m)(role=m.role, text=storable(m.text)) for m in turn.messages),
        created_at=turn.created_at,
        complete=turn.complete,
        dedup_key=storable(turn.dedup_key) if turn.dedup_key is not None else None,
        metas=(tuple(_storable_meta(m) for m in turn.metas)
               if turn.metas is not None else None),
    )


def prepare_turn(turn: TurnRecord, max_message_bytes: int) -> PreparedTurn | None:
    """The turn made storable with its non-empty messages cleaned for storage
    (role, content, truncated, meta); None when every message is empty.

    Private spans are redacted again here (``privacy.redact_turn``; a live turn
    was already redacted where it was made, so this finds nothing there): an
    imported transcript or any other writer of turns gets the same rule."""
    turn = storable_turn(turn)
    metas = turn.metas if turn.metas is not None else (None,) * len(turn.messages)
    rows: list[tuple[str, str, bool, dict[str, Any] | None]] = []
    for message, meta in zip(redact_turn(turn.messages), metas, strict=True):
        content, truncated = clean_for_storage(message.text, max_message_bytes)
        if content.strip():
            rows.append((message.role, content, truncated, meta))
    return PreparedTurn(turn, rows) if rows else None


@dataclass(slots=True)
class PreparedTurn:
    turn: TurnRecord
    rows: list[tuple[str, str, bool, dict[str, Any] | None]]

    @property
    def inputs(self) -> list[str]:
        """The client-side input texts (what a retry of the same request repeats)."""
        return [content for role, content, _, _ in self.rows if role in INPUT_ROLES]


def meta_json(meta: dict[str, Any] | None) -> str | None:
    return orjson.dumps(meta).decode() if meta is not None else None


# A session's project, once known, is kept when a turn of it names none: a
# client's helper calls (a title, a classifier) share the session's id but not
# its system prompt, where the working directory is read from.
SESSION_PROJECT = (
    f" project = CASE WHEN excluded.project = '{UNKNOWN_PROJECT}'"
    " THEN sessions.project ELSE excluded.project END,"
)


def write_turn(conn: Connection, turn: TurnRecord, max_message_bytes: int) -> list[int] | None:
    """Insert one turn; the new message ids, or ``None`` when nothing was written.

    Nothing is written when every message is empty after cleaning, or when the
    turn's ``dedup_key`` is already stored (an import seen before).
    """
    prepared = prepare_turn(turn, max_message_bytes)
    return None if prepared is None else write_prepared(conn, prepared)


def write_prepared(conn: Connection, prepared: PreparedTurn) -> list[int] | None:
    """``write_turn`` after ``prepare_turn``."""
    turn, rows = prepared.turn, prepared.rows
    ident = turn.identity
    if turn.dedup_key is not None and not _claim_dedup_key(conn, turn.dedup_key):
        return None
    _supersede_incomplete(conn, turn, prepared.inputs)
    turn_id = _insert_turn(conn, turn)
    ids: list[int] = []
    for seq, (role, content, truncated, meta) in enumerate(rows):
        ids.append(conn.insert(
            "INSERT INTO messages(turn_id, tenant, project, session, seq, role, content, tokens,"
            " created_at, truncated, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (turn_id, ident.tenant, ident.project, ident.session, seq, role, content,
             estimate_tokens(content), turn.created_at, int(truncated),
             meta_json(meta)),
        ))
    conn.execute(
        "INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)"
        " VALUES (?,?,?,?,?,1) ON CONFLICT(tenant, id) DO UPDATE SET"
        + SESSION_PROJECT +
        " first_seen = CASE WHEN excluded.first_seen < sessions.first_seen"
        " THEN excluded.first_seen ELSE sessions.first_seen END,"
        " last_seen = CASE WHEN excluded.last_seen > sessions.last_seen"
        " THEN excluded.last_seen ELSE sessions.last_seen END,"
        " turns = sessions.turns + 1",
        (ident.tenant, ident.session, ident.project, turn.created_at, turn.created_at),
    )
    return ids


def _insert_turn(conn: Connection, turn: TurnRecord) -> int:
    ident = turn.identity
    return conn.insert(
        "INSERT INTO turns(tenant, project, session, protocol, model, created_at, complete,"
        " dedup_key) VALUES (?,?,?,?,?,?,?,?)",
        (ident.tenant, ident.project, ident.session, turn.protocol, turn.model,
         turn.created_at, int(turn.complete), turn.dedup_key),
    )


def _claim_dedup_key(conn: Connection, key: str) -> bool:
    """``False`` if this exact key is stored; else drop older versions of it."""
    if conn.execute("SELECT 1 FROM turns WHERE dedup_key = ?", (key,)).fetchone() is not None:
        return False
    stable, sep, _version = key.partition("#")
    if sep:
        # '$' sorts right after '#': the range is every "<stable>#..." key.
        for old_id in _int_column(conn.execute(
            "SELECT id FROM turns WHERE dedup_key > ? AND dedup_key < ?",
            (stable + "#", stable + "$"),
        )):
            _delete_turn(conn, old_id)
    return True


def _supersede_incomplete(conn: Connection, turn: TurnRecord, user_texts: list[str]) -> None:
    """Drop earlier incomplete attempts of this session that carried the same input
    (the user's words, or the tool results of a tool-loop step).

    Clients retry a failed request with the same new input (Codex up to
    ``stream_max_retries`` times); the retry's turn replaces the partial one so the
    user's words are stored once.
    """
    if not user_texts:
        return
    ident = turn.identity
    for old_id in _int_column(conn.execute(
        "SELECT id FROM turns WHERE tenant = ? AND session = ? AND complete = 0",
        (ident.tenant, ident.session),
    )):
        old_texts = [
            row[0]
            for row in conn.execute(
                "SELECT content FROM messages WHERE turn_id = ? AND role IN ('user', 'tool')"
                " ORDER BY seq",
                (old_id,),
            )
        ]
        if old_texts == user_texts:
            _delete_turn(conn, old_id)


def _delete_turn(conn: Connection, turn_id: int) -> None:
    row = conn.execute("SELECT tenant, session FROM turns WHERE id = ?", (turn_id,)).fetchone()
    if row is None:
        return
    conn.execute("DELETE FROM turns WHERE id = ?", (turn_id,))
    conn.execute(
        "UPDATE sessions SET turns = turns - 1 WHERE tenant = ? AND id = ?", (row[0], row[1])
    )


def _int_column(cursor: Cursor) -> list[int]:
    return [row[0] for row in cursor.fetchall() if isinstance(row[0], int)]
