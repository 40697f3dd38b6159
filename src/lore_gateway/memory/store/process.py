"""Writing turns in a child process, so storage never shares the gateway's GIL.

A turn's SQLite work (savepoints, inserts, the FTS triggers, the commit) and the
Python around it (cleaning, redaction, statement building) cost about 0.4 ms of
CPU per turn. On the gateway's writer thread that time is taken from the event loop
through the GIL, and at one request at a time it lands exactly when the client's
next request arrives (docs/notes/2026-12-03-overhead-history.md, "Where the time
goes"). Here the gateway only writes the finished turn to a pipe (``turn_pipe``, as
a tuple of builtins: ``records.turn_to_wire``, a few microseconds); a child process,
``lore-store``, runs the very same ``TurnWriter`` (its batching, savepoints, retries
while the database is unreachable, its own supervisor) against its own connection.

The parent keeps what the proxy and ``/health`` read in-process: the bound on
turns in flight (``TurnSink.admit`` back-pressure), the counters, ``degraded``
and ``flush``. The child reports after every batch: the message ids it committed
(handed to the embedding process here, as the writer thread did) and how many
turns it processed, wrote, skipped or failed.

Jobs (``run_job``/``submit_job``: deletions, recall anchors, context state,
background work) stay on the gateway's own writer thread: they are closures over
the gateway's objects. The database then has two writers, this child and that
thread; each takes the write lock per batch under the 5 s busy timeout, like the
embedding process always has. ``Memory.write_job`` waits for the turns already
submitted before it runs, so a job still runs behind every queued turn.

A child that dies is replaced (with back-off) and ``degraded`` says so
meanwhile; the turns it held are counted as dropped. A child whose gateway
died writes what it has queued, then exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from lore_gateway.memory.child import ChildProcess
from lore_gateway.memory.store.records import RawTurn, TurnRecord, turn_from_wire, turn_to_wire
from lore_gateway.memory.store.turn_pipe import PipeClosed, PipeReceiver, PipeSender, make_pipe
from lore_gateway.memory.store.writer import (
    DEFAULT_MAX_QUEUE,
    DROP_WARNING_INTERVAL_S,
    RESTART_BACKOFF_S,
    TurnWriter,
)
from lore_gateway.storage.base import Database

log = logging.getLogger(__name__)

# How often each side checks that the other is alive while its queue is idle.
ALIVE_CHECK_S = 1.0
# The child reports its progress at most this often (a flush asks at once): a
# report wakes a thread of the gateway, which then takes the GIL from the loop,
# so one per turn would bring back part of what the process saves. A 50 ms old
# queue depth is fine for back-pressure; embedding is later by as much.
REPORT_INTERVAL_S = 0.05
# How long a turn waits in the child for more turns to share its commit. A
# commit of one turn costs about as much CPU as the turn's own rows (the WAL
# frames of every page it touched, a segment per search index); traffic at
# c=16 brings a turn every few milliseconds, so turns rarely queue up on their
# own. Within the report interval: the gateway and the embedder learn of a
# turn no later than they would have anyway, give or take one report. A flush
# (a job, a test, a shutdown) does not wait.
GROUP_COMMIT_WAIT_S = REPORT_INTERVAL_S
# After reading turns, the child pauses this long before it reads again, so the
# turns of the pause arrive in one read: a child asleep on the pipe is woken
# (a context switch on a busy 2-core machine, ~25 us of its CPU) by every
# turn the gateway writes; one that is not asleep on it is not, and the
# gateway's write wakes nobody. Shorter than the group wait, so commits lose
# no company; a flush waits at most this much longer. The pipe holds 1 MiB.
READ_PAUSE_S = 0.02
# How long opening waits for the child to have its connection (an interpreter
# start and the writer's imports: about a second on a loaded 2-core machine).
START_TIMEOUT_S = 60.0
# How long ``close`` waits for the child to write what is queued (the writer
# thread's own close waits as long).
CLOSE_TIMEOUT_S = 30.0
_STOP = None
_FLUSH = "flush"


class TurnStoreProcess:
    """The turn half of ``TurnWriter``'s interface, served by a child process."""

    def __init__(self, database: Database | Path, *, max_message_bytes: int,
                 max_queue: int = DEFAULT_MAX_QUEUE,
                 on_commit: Callable[[list[int]], None] | None = None) -> None:
        from lore_gateway.storage import db

        self._database = db.database(database)
        self._max_message_bytes = max_message_bytes
        self._capacity = max_queue
        self._on_commit = on_commit
        self._state = threading.Condition()
        self._submitted = 0
        self._processed = 0
        self.written = 0
        self.skipped = 0
        self.failed = 0
        self.dropped = 0
        self.restarts = 0
        # Why turns are not being written right now: the child's own (its writer
        # is retrying), or this side's (the child died and is being replaced).
        self._child_degraded: str | None = None
        self._own_degraded: str | None = None
        self._closing = False
        self._last_drop_warning = -DROP_WARNING_INTERVAL_S
        self._ready = threading.Event()
        self._spawn()
        self._reader = threading.Thread(target=self._read_acks, name="lore-store-acks",
                                        daemon=True)
        self._reader.start()
        # Like the writer thread, start ready: the first turns never wait for an
        # interpreter to start, and a job's wait for them (``write_job``) is short.
        if not self._ready.wait(START_TIMEOUT_S):
            log.warning("memory: the storage process is not up after %.0f s; turns wait "
                        "for it", START_TIMEOUT_S)

    def _spawn(self) -> None:
        """A fresh child with fresh pipes (a dead child may leave them half-written):
        turns in, reports out."""
        read_fd, write_fd = make_pipe()
        acks_read, acks_write = make_pipe()
        try:
            self._process = ChildProcess(
                __name__, "_child_main",
                (self._database.address, self._max_message_bytes, self._capacity,
                 read_fd, acks_write),
                fds=(read_fd, acks_write))
        finally:
            os.close(read_fd)  # only the child reads: it sees EOF when this side goes
            os.close(acks_write)
        self._turns = PipeSender(write_fd)
        self._acks = PipeReceiver(acks_read)

    def _send(self, item: object) -> bool:
        try:
            self._turns.send(item)
        except PipeClosed:
            return False  # the child died: the reader thread replaces it
        return True

    # --- what the gateway reads ----------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Turns submitted and not yet processed by the child."""
        return self._submitted - self._processed

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def degraded(self) -> str | None:
        return self._own_degraded or self._child_degraded

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def submit(self, turn: TurnRecord | RawTurn, *, wait: bool = False) -> bool:
        """Queue a turn; ``False`` (and a warning) when the queue is full or closed.
        ``wait=True`` waits for room instead (imports, benchmarks)."""
        wire = turn_to_wire(turn)
        with self._state:
            if self._closing:
                self.dropped += 1
                log.warning("memory writer is closed; turn not stored")
                return False
            if wait:
                self._state.wait_for(lambda: self.queue_depth < self._capacity
                                     or self._closing)
            elif self.queue_depth >= self._capacity:
                self._drop()
                return False
            self._submitted += 1
            self._send(wire)  # lost with a dead child: counted when it is replaced
        return True

    def _drop(self) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S:
            self._last_drop_warning = now
            log.warning("memory write queue is full (%d turns); turns are not being "
                        "stored (%d dropped so far)", self._capacity, self.dropped)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every turn submitted so far is processed; ``False`` on timeout."""
        with self._state:
            target = self._submitted
            if self._processed >= target:
                return True
            self._send(_FLUSH)  # the child reports at once, not after 50 ms
            return self._state.wait_for(lambda: self._processed >= target, timeout)

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued, then stop the child."""
        with self._state:
            if self._closing:
                return
            self._closing = True
            self._state.notify_all()
        self._send(_STOP)
        self._turns.close()
        self._process.join(timeout)
        if self._process.is_alive():
            log.warning("memory: the storage process did not finish within %.0f s; "
                        "%d turns still queued", timeout or 0, self.queue_depth)
            self._process.kill()
            self._process.join(5)
        self._reader.join(5)

    # --- the child's reports -------------------------------------------------------

    def _read_acks(self) -> None:
        """The child's reports until it exits (end of file on its pipe); a child that
        exits without being stopped is replaced."""
        failures = 0
        while True:
            try:
                acks = self._acks.receive(ALIVE_CHECK_S)
                ended = not acks and not self._process.is_alive()
            except (PipeClosed, OSError):
                ended = True
            if ended:
                self._acks.close()
                self._process.join(CLOSE_TIMEOUT_S)  # it is exiting
                if self._closing:
                    return
                self._replace(failures)
                failures += 1
                continue
            for ack in acks:
                kind = ack[0]
                if kind == "progress":
                    if ack[5] and self._on_commit is not None:
                        try:
                            self._on_commit(ack[5])
                        except Exception:
                            log.exception("memory: the post-commit hook failed")
                    self._progress(*ack[1:5])
                elif kind == "state":
                    self._ready.set()
                    self._child_degraded = ack[1]
                    if ack[1] is None:
                        failures = 0
                        self._own_degraded = None

    def _progress(self, count: int, written: int, skipped: int, failed: int) -> None:
        """The child's deltas since its last report. Counted in the metrics first,
        so that a ``flush`` that returns has them there too."""
        if written > 0:
            from lore_gateway.obs import metrics  # the gateway's; never in the child

            metrics.record_stored_turns(written)
        with self._state:
            self._processed += count
            self.written += written
            self.skipped += skipped
            self.failed += failed
            self._state.notify_all()

    def _replace(self, failures: int) -> None:
        """The child died without being stopped: count what it held, start another."""
        code = self._process.exitcode
        self._own_degraded = f"the storage process died (exit code {code}) and is restarting"
        log.error("memory: %s", self._own_degraded)
        time.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
        with self._state:
            if self._closing:
                return
            lost = self._submitted - self._processed
            self._processed = self._submitted
            self.dropped += lost
            self.restarts += 1
            self._turns.close()
            self._spawn()
            self._state.notify_all()
        if lost:
            log.error("memory: %d turns queued in the dead storage process are lost", lost)


def _child_main(address: str, max_message_bytes: int, max_queue: int, pipe_fd: int,
                acks_fd: int) -> None:
    """The child: one ``TurnWriter`` fed from the gateway's pipe.

    Signals are the gateway's business: Ctrl-C reaches the whole process group,
    and a service manager may signal every process of the service, but the
    queued turns are written when the gateway says stop, or closes the pipe by
    dying."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)
    from lore_gateway import heap
    from lore_gateway.storage import db
    from lore_gateway.storage.target import parse_url

    heap.name_process("lore-store")
    heap.start_trimmer()
    acks = PipeSender(acks_fd)
    reports = _Reports(acks)
    try:
        writer = TurnWriter(partial(db.connect_writer, parse_url(address)),
                            max_message_bytes=max_message_bytes, max_queue=max_queue,
                            on_commit=reports.committed, on_done=reports.done,
                            on_stored=_counted_by_the_gateway,
                            group_wait_s=GROUP_COMMIT_WAIT_S)
    except Exception as exc:
        acks.send(("state", f"memory writer cannot open the database: {exc}"[:300]))
        acks.close()
        raise SystemExit(1) from exc
    reports.writer = writer
    reported: str | None = None
    acks.send(("state", None))
    receiver = PipeReceiver(pipe_fd)
    # A flush asked for and not yet reported. Never waited for here without a
    # bound: while the database cannot be reached the writer keeps its batch and
    # retries, and a child stuck in that wait would not see its gateway die.
    flushing = False
    try:
        while True:
            try:
                items = receiver.receive(REPORT_INTERVAL_S)
            except PipeClosed:
                return  # the gateway is gone: the writer's close writes what is queued
            if writer.degraded != reported:
                reported = writer.degraded
                acks.send(("state", reported))
            pause = False
            for item in items:
                if item is _STOP:
                    return
                if item == _FLUSH:
                    flushing = True
                else:
                    writer.submit(turn_from_wire(item), wait=True)
                    pause = True
            if flushing and writer.flush(REPORT_INTERVAL_S):
                flushing = False
                reports.send()
            if time.monotonic() - reports.sent_at >= REPORT_INTERVAL_S:
                reports.send()
            if pause and not flushing:
                time.sleep(READ_PAUSE_S)
    finally:
        writer.close()
        reports.send()
        acks.close()


def _counted_by_the_gateway(count: int) -> None:
    """The child's stored turns reach ``/metrics`` through its reports."""


class _Reports:
    """The child's progress since its last report, gathered on its writer thread."""

    def __init__(self, acks: PipeSender) -> None:
        self._acks = acks
        self._lock = threading.Lock()
        self.writer: TurnWriter | None = None
        self._count = 0
        self._ids: list[int] = []
        self._sent = (0, 0, 0)  # the writer's written, skipped, failed when last sent
        self._now = (0, 0, 0)  # ... after its last batch
        self.sent_at = time.monotonic()

    def committed(self, ids: list[int]) -> None:
        with self._lock:
            self._ids.extend(ids)

    def done(self, count: int) -> None:
        writer = self.writer
        with self._lock:
            self._count += count
            if writer is not None:
                self._now = (writer.written, writer.skipped, writer.failed)

    def send(self) -> None:
        self.sent_at = time.monotonic()
        with self._lock:
            if not self._count and not self._ids:
                return
            now = self._now
            deltas = [n - s for n, s in zip(now, self._sent, strict=True)]
            report = ("progress", self._count, *deltas, self._ids)
            self._count, self._ids, self._sent = 0, [], now
        with contextlib.suppress(PipeClosed):  # the gateway is gone
            self._acks.send(report)
