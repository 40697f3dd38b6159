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
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lore_gateway.memory.store.records import RawTurn, TurnRecord
from lore_gateway.memory.store.writer_batch import brief, commit_batch, resolve
from lore_gateway.storage.base import Connection
from lore_gateway.storage.db import ConnFactory
from lore_gateway.storage.errors import StorageUnavailable

log = logging.getLogger(__name__)

# 10,000 queued turns is minutes of traffic from every agent on a workstation; if
# the disk stalls longer than that, dropping (and counting) beats unbounded memory.
DEFAULT_MAX_QUEUE = 10_000
# Turns per commit when a backlog exists. Large enough to amortise the commit,
# small enough that a reader never waits long behind the write lock.
MAX_TURNS_PER_COMMIT = 256
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

T = TypeVar("T")


@dataclass(slots=True)
class _Job(Generic[T]):
    run: Callable[[Connection], T]
    future: Future[T]


_STOP = object()


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
                self.degraded = f"memory writer cannot open the database: {brief(exc)}"
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
                self.last_error = brief(exc)
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
                self.degraded = f"memory writer cannot open the database: {brief(exc)}"
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
        resolved = resolve(batch)
        self.failed += resolved.failed
        self.skipped += resolved.skipped
        if resolved.failed + resolved.skipped:
            self._done(resolved.failed + resolved.skipped)
        batch = resolved.items
        if not batch:
            return
        attempt = 0
        while True:
            try:
                self._commit_batch(conn, batch)
            except StorageUnavailable as exc:
                if self._closing and attempt + 1 >= CLOSING_ATTEMPTS:
                    self.failed += len(batch)
                    log.error("memory: stopping while the database cannot be reached; %d "
                              "turns are not stored (%s)", len(batch), brief(exc))
                    self._done(len(batch))
                    return
                self.degraded = (f"the memory database cannot be reached; {len(batch)} turns "
                                 f"wait to be written ({brief(exc)})")
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

    def _commit_batch(self, conn: Connection, batch: list[object]) -> None:
        """One commit of whole turns (``writer_batch.commit_batch``), counted;
        raises ``StorageUnavailable`` (nothing committed, the batch not counted
        as done) when the database cannot be reached."""
        turns = [item for item in batch if isinstance(item, TurnRecord)]
        assert len(turns) == len(batch)
        try:
            done = commit_batch(conn, turns, self._max_message_bytes)
        except StorageUnavailable:
            raise
        except BaseException:
            self._done(len(batch))
            raise
        self.written += done.written
        self.skipped += done.skipped
        self.failed += done.failed
        try:
            if done.committed:
                self._on_stored(done.written)
        finally:
            if done.message_ids and self._on_commit is not None:
                try:
                    self._on_commit(done.message_ids)
                except Exception:
                    log.exception("memory: the post-commit hook failed")
            self._done(len(batch))
