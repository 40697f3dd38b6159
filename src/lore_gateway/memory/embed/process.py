"""Embedding stored messages in a separate, low-priority process.

A MiniLM forward pass costs ~10 ms of CPU per message, more than relaying the
whole turn did. Run in the gateway's process it competes with the proxy for the
CPU and, worse, for the GIL: a background thread holding the GIL when the
scheduler pauses it stalls the event loop. In its own process at the lowest
scheduling priority (nice 19) it uses whatever CPU the machine has spare: all
of it when idle (imports, benchmarks), almost none under a traffic burst, whose
messages are then embedded later. The vectors land in the shared SQLite file,
where search picks them up. Nice 19 was not enough on 2 cores (a model run
streams its weights through the shared cache while requests are served beside
it), so the backlog also waits, before each text, for a quiet moment of the
proxy's, at most ``traffic.MAX_DEFER_S`` (``memory/store/traffic.py``), and after a
run during which the machine's tasks waited for a CPU, for the machine to be
quiet as well, within the same bound.

The interface is the in-process ``EmbeddingWorker``'s: ``submit``, ``backfill``,
``flush``, ``close``. The queue is bounded; what does not fit is dropped, counted
and left for ``backfill``.

The same process answers recall searches (``search_channel``, used by
``search_process.SearchProcess`` when ``LORE_SEARCH_WORKERS`` is 0, the default,
and served by ``search_child.serve``): it holds the model anyway, and a second
model process costs ~140 MiB.
Searches run on a thread at normal priority; only the backlog thread runs at
nice 19 (Linux keeps a nice value per thread), so a search never waits behind
the backlog for the CPU, and the backlog still yields to the relay. Both share
one onnxruntime session with one intra-op thread, so each run executes on, and
at the priority of, the thread that asked for it.

A child that dies is restarted (up to ``MAX_RESTARTS`` times, then search stays
BM25-only and ``degraded`` says so), and the restarted child is given the
backlog again by ``backfill``. ``close`` never waits for the backlog: whatever
is not embedded is found again by the next start's backfill, so shutdown takes
the same time with 10 or 10,000 messages waiting.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lore_gateway.memory.child import ChildProcess
from lore_gateway.memory.store.traffic import CpuPressure, TrafficClock, busy
from lore_gateway.memory.store.turn_pipe import PipeClosed, PipeReceiver, PipeSender, make_pipe
from lore_gateway.storage.base import Connection, Database

if TYPE_CHECKING:
    from lore_gateway.memory.embed.embedder import Embedder, FloatArray
    from lore_gateway.memory.embed.vectors import TextEmbedder

log = logging.getLogger(__name__)

# Id batches waiting for the process (each up to a turn's messages, or a
# backfill slice); beyond it, ids are dropped and left for backfill.
MAX_PENDING_BATCHES = 10_000
BACKGROUND_NICE = 19
# How often an idle child checks that the gateway that started it is alive.
PARENT_CHECK_SECONDS = 1.0
# Messages embedded (and committed) per step of a job: a progress bar moves every
# step, and a stop request waits at most one step.
STEP_MESSAGES = 16
# Restarts of a child that died (a crash, the OOM killer) before giving up; a
# message that kills the model every time must not turn into a restart loop.
MAX_RESTARTS = 5
# A trim when the queue runs empty, at most this often: freed run buffers (a
# 256-token text's activations) otherwise stay resident until the 30 s trimmer;
# measured, the process held 251 MiB right after a backlog, 189 MiB trimmed.
IDLE_TRIM_S = 5.0
# Seconds to wait for a child whose search socket closed to finish exiting.
REAP_S = 2.0
# Attempts at writing one batch of vectors while another process holds the lock.
WRITE_ATTEMPTS = 3


class EmbeddingProcess:
    """One child process that embeds committed messages and stores their vectors."""

    def __init__(self, database: Database | Path, *,
                 max_pending: int = MAX_PENDING_BATCHES, rerank: bool = False) -> None:
        self._rerank = rerank
        self._max_pending = max_pending
        self._idle = threading.Condition()
        self._pending = 0
        self.submitted = 0  # message ids handed in (progress bars: progress / submitted)
        self.embedded = 0
        # Messages embedded so far, as the child reports after every step.
        self._progress = 0
        self.dropped = 0
        self.restarts = 0
        self.degraded: str | None = None
        self._closing = False
        # Held while the child is replaced: the ack reader and a search that finds
        # the child dead may both try to.
        self._lifecycle = threading.RLock()
        from lore_gateway.storage import db

        self._database = db.database(database)
        # The proxy marks each request here; the backlog waits for a quiet moment
        # before each text (memory/store/traffic.py). Kept across restarts.
        self.traffic = TrafficClock()
        self._spawn()
        self._reader = threading.Thread(target=self._read_acks, name="lore-embed-acks",
                                        daemon=True)
        self._reader.start()

    def _spawn(self) -> None:
        """A fresh child with fresh pipes (a dead child may leave them half-written).

        Three pipes and a socket pair: jobs in, reports out, and a stop pipe the
        child watches between steps (this side closes it to stop the child; so
        does this process's death). The socket pair is the search channel."""
        jobs_read, jobs_write = make_pipe()
        acks_read, acks_write = make_pipe()
        stop_read, stop_write = os.pipe()
        # The child also answers searches (memory/search/process.py): the gateway's
        # one model process. The event loop reads and writes our end.
        self._search_sock, theirs = socket.socketpair()
        theirs_fd = theirs.detach()
        ends = (jobs_read, acks_write, stop_read, theirs_fd)
        try:
            self._process = ChildProcess(
                __name__, "_child_main",
                (self._database.address, jobs_read, acks_write, stop_read, os.getpid(),
                 theirs_fd, self._rerank, self.traffic.fd),
                fds=(*ends, self.traffic.fd))
        finally:
            for fd in ends:  # the child's ends: it sees EOF when this side's go
                os.close(fd)
        self._jobs = PipeSender(jobs_write)
        self._acks = PipeReceiver(acks_read)
        self._stop_fd = stop_write

    def search_channel(self, dead: ChildProcess | None = None
                       ) -> tuple[socket.socket, ChildProcess] | None:
        """A socket to the child's search loop (a duplicate, owned by the caller) and
        the child; a dead child is replaced first. ``dead``: the child whose socket
        the caller saw close, reaped first (it is exiting; the exit takes moments).
        ``None`` once closed or degraded."""
        with self._lifecycle:
            if dead is self._process and not self._closing:
                self._process.join(timeout=REAP_S)
            if not self._closing and not self._process.is_alive():
                self._restart()
            if self._closing or self.degraded is not None:
                return None
            return self._search_sock.dup(), self._process

    def submit(self, message_ids: list[int]) -> None:
        """Queue ids for embedding; never blocks (drops and counts when full)."""
        if not message_ids:
            return
        with self._idle:
            self.submitted += len(message_ids)
            if self._pending >= self._max_pending:
                self.dropped += len(message_ids)
                log.warning("embedding queue full; %d messages left for backfill",
                            len(message_ids))
                return
            self._pending += 1
            jobs = self._jobs
        try:
            jobs.send(list(message_ids))
        except PipeClosed:  # the child died: its replacement's backfill finds them
            with self._idle:
                if jobs is self._jobs:  # else the restart already cleared the count
                    self._pending -= 1
                    self._idle.notify_all()

    def backfill(self) -> None:
        """Queue every stored message that has no embedding yet."""
        from lore_gateway.storage import db

        conn = db.connect(self._database)
        try:
            ids = [int(r[0]) for r in conn.execute(
                "SELECT id FROM messages WHERE id NOT IN (SELECT message_id FROM embeddings)")]
        finally:
            conn.close()
        for start in range(0, len(ids), 256):
            self.submit(ids[start:start + 256])

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is embedded; ``False`` on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0 or not self.alive, timeout)

    @property
    def progress(self) -> int:
        """Messages embedded so far, including those of jobs still running."""
        return self._progress

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the child after its current batch; the backlog waits for backfill."""
        with self._lifecycle:
            self._closing = True
        self._close_stop_pipe()
        self._process.join(timeout=timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        self._reader.join(timeout=5)
        self._jobs.close()
        self._search_sock.close()
        self.traffic.close()
        with self._idle:
            self._idle.notify_all()

    def _restart(self) -> None:
        """The child died without being stopped: start another and give it the backlog."""
        with self._lifecycle:
            if self._process.is_alive() or self._closing:
                return  # already replaced (by a search that found it dead)
            self._restart_dead()

    def _restart_dead(self) -> None:
        code = self._process.exitcode
        if self.restarts >= MAX_RESTARTS:
            if self.degraded is None:
                self.degraded = (f"the embedding process died {self.restarts + 1} times "
                                 f"(last exit code {code}); search uses BM25 only")
                log.error("memory: %s", self.degraded)
            with self._idle:
                self._pending = 0
                self._idle.notify_all()
            return
        self.restarts += 1
        log.error("memory: the embedding process died (exit code %s); restarting it", code)
        with self._idle:
            self._pending = 0  # what the dead child held is found again by backfill
            self._idle.notify_all()
        self._search_sock.close()
        self._jobs.close()
        self._close_stop_pipe()
        self._spawn()
        threading.Thread(target=self._backfill_quietly, name="lore-embed-backfill",
                         daemon=True).start()

    def _backfill_quietly(self) -> None:
        try:
            self.backfill()
        except Exception:
            log.exception("memory: re-queueing messages after an embedder restart failed")

    def _ack(self, embedded: int) -> None:
        with self._idle:
            self._pending -= 1
            self.embedded += embedded
            self._idle.notify_all()

    def _close_stop_pipe(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._stop_fd)

    def _read_acks(self) -> None:
        """The child's reports: ``("step", n)`` after every step, ``("job", n)`` after
        every job. End of file means the child exited: replace it, unless closing."""
        while True:
            acks = self._acks
            try:
                reports = acks.receive(PARENT_CHECK_SECONDS)
            except (PipeClosed, OSError):
                reports = None
            if reports:
                for kind, count in reports:
                    if kind == "step":
                        self._progress += count
                    else:
                        self._ack(count)
                continue
            if reports is None:
                acks.close()
                if acks is self._acks:  # not already replaced by a search
                    self._process.join(timeout=REAP_S)  # it is exiting
            if not self._process.is_alive():
                if self._closing or self.degraded is not None:
                    with self._idle:
                        self._idle.notify_all()  # flush() must not wait on a dead child
                    return
                self._restart()
                with self._idle:
                    self._idle.notify_all()


def _store_with_retry(conn: Connection, embedder: TextEmbedder, ids: list[int]) -> int:
    """``embed_and_store``, retried when the gateway's writer holds the lock longer
    than the busy timeout (a big import batch), instead of losing the batch."""
    from lore_gateway.memory.embed.vectors import embed_and_store
    from lore_gateway.storage.errors import StorageBusy

    for attempt in range(WRITE_ATTEMPTS):
        try:
            return embed_and_store(conn, embedder, ids)
        except StorageBusy:
            if attempt == WRITE_ATTEMPTS - 1:
                raise
    return 0


def _child_main(address: str, jobs_fd: int, acks_fd: int, stop_fd: int, parent: int,
                search_fd: int, rerank: bool, traffic_fd: int) -> None:
    """The child: one embedder shared by a search thread at normal priority and the
    backlog, embedded on this (main) thread at the lowest priority, each text
    after a quiet moment of the proxy's."""
    from lore_gateway import heap
    from lore_gateway.memory.embed.embedder import SEARCH_THREADS, load_embedder
    from lore_gateway.memory.search import child as search_child

    heap.name_process("lore-embed")
    heap.start_trimmer()
    # One intra-op thread: every run executes on its caller's thread, so a backlog
    # run takes the backlog thread's priority and a search run the search thread's
    # (onnxruntime's pool threads would take their creator's, for both).
    embedder = load_embedder(threads=SEARCH_THREADS)
    threading.Thread(target=search_child.serve,
                     args=(search_fd, search_child.searcher(address, embedder, rerank=rerank)),
                     name="lore-embed-search", daemon=True).start()
    _lower_priority()
    backlog = None if embedder is None else _Yielding(embedder, TrafficClock(traffic_fd))
    _embed_backlog(address, backlog, _Jobs(jobs_fd, stop_fd, parent), PipeSender(acks_fd))


class _Yielding:
    """The backlog's view of the embedder: before each text it waits (boundedly)
    for the proxy to be quiet (``TrafficClock.wait_quiet``) and, after a run
    during which the machine's tasks waited for a CPU, for the machine to be
    quiet too. Searches use the embedder itself and never wait."""

    def __init__(self, embedder: Embedder, traffic: TrafficClock) -> None:
        self._embedder = embedder
        self._traffic = traffic
        self._pressure = CpuPressure()
        self._busy = False
        self.model_name: str = embedder.model_name
        self.dim: int = embedder.dim

    def embed(self, texts: list[str]) -> FloatArray:
        import numpy as np

        rows = []
        for text in texts:
            self._traffic.wait_quiet(pressure=self._pressure if self._busy else None)
            began, stall = time.monotonic_ns(), self._pressure.stall_us()
            rows.append(self._embedder.embed([text]))
            self._busy = busy(self._pressure.stall_us(), stall, time.monotonic_ns() - began)
        return np.concatenate(rows) if rows else self._embedder.embed([])


class _Jobs:
    """The child's end of the job pipe and the stop pipe."""

    def __init__(self, jobs_fd: int, stop_fd: int, parent: int) -> None:
        self._jobs = PipeReceiver(jobs_fd)
        self._jobs_fd = jobs_fd
        self._stop_fd = stop_fd
        self._parent = parent
        self._waiting: collections.deque[list[int]] = collections.deque()

    def stopped(self) -> bool:
        """The gateway closed the stop pipe (``close``, or it died), or we were orphaned."""
        if os.getppid() != self._parent:
            return True
        ready, _, _ = select.select([self._stop_fd], [], [], 0)
        return bool(ready)

    def empty(self) -> bool:
        return not self._waiting

    def get(self) -> list[int] | None:
        """The next job, waiting at most ``PARENT_CHECK_SECONDS``; ``None`` without one."""
        if not self._waiting:
            ready, _, _ = select.select([self._jobs_fd, self._stop_fd], [],
                                        [], PARENT_CHECK_SECONDS)
            if self._jobs_fd in ready:
                self._waiting.extend(self._jobs.receive(0))
        return self._waiting.popleft() if self._waiting else None


def _lower_priority() -> None:
    """Nice 19 for this thread only where the nice value is per thread (Linux), else
    for the whole process: a backlog must never take CPU from the relay. Elsewhere
    searches share its priority, as the embedder's did before it served searches."""
    with contextlib.suppress(OSError):
        if sys.platform.startswith("linux"):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        else:
            os.nice(BACKGROUND_NICE)


def _embed_backlog(address: str, embedder: _Yielding | None, jobs: _Jobs,
                   acks: PipeSender) -> None:
    """Embed job after job, one connection, until stopped or orphaned."""
    from lore_gateway import heap
    from lore_gateway.storage import db
    from lore_gateway.storage.target import parse_url

    conn = db.connect_writer(parse_url(address))
    trimmed = time.monotonic()
    try:
        while True:
            if jobs.stopped():
                return  # stopped, or the gateway died without stopping us: never linger
            try:
                ids = jobs.get()
            except PipeClosed:
                return  # the gateway is gone
            if ids is None:
                continue
            done = 0
            if embedder is not None:
                try:
                    for start in range(0, len(ids), STEP_MESSAGES):
                        if jobs.stopped():
                            return
                        step = _store_with_retry(conn, embedder,
                                                 ids[start:start + STEP_MESSAGES])
                        done += step
                        acks.send(("step", step))
                except PipeClosed:
                    return
                except Exception:
                    logging.getLogger(__name__).exception(
                        "embedding %d messages failed; they stay BM25-only", len(ids))
            try:
                acks.send(("job", done))
            except PipeClosed:
                return
            if jobs.empty() and time.monotonic() - trimmed > IDLE_TRIM_S:
                heap.trim()  # a backlog's run buffers, given back once it is done
                trimmed = time.monotonic()
    finally:
        conn.close()
        acks.close()
