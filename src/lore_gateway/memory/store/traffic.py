"""When the proxy last began or ended a request, shared with the embedding process.

The embedding backlog runs at nice 19, yet on a 2-core machine it still slowed
the requests served beside it: with it on, a request at c=1 took 0.3–0.6 ms
longer at the median than with ``LORE_EMBEDDINGS=false`` (docs/benchmarks.md,
issue 14, fifth round), and ``SCHED_IDLE`` did no better. A model run streams
~22 MB of int8 weights through the shared L3 cache and the memory bus, which
no scheduling priority takes back. So the backlog also waits, before each
text, until the proxy has been quiet for a moment: a request arriving in a
burst then rarely meets a model run.

Waiting for the proxy alone moves the backlog's runs into moments when the
proxy is quiet but the machine may not be: other programs (a build, the test
suite, another server) then meet the model runs instead. So a run during which
the machine's tasks waited for a CPU (Linux's pressure stall information,
``/proc/pressure/cpu``) makes the next text wait for a moment without such
waiting too, within the same bound: on a saturated machine the backlog slows to
one text per bound, whoever saturates it; an idle machine never waits.

The gateway writes one integer, the monotonic clock in nanoseconds
(``CLOCK_MONOTONIC``, one clock for every process of the machine), into a page
shared with the child: no system call and no wake-up per request. The child
reads it before each text. The wait is bounded (``MAX_DEFER_S``), so under
continuous traffic vectors still arrive, one text per bound at the least.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

# Quiet the proxy must have been, no request begun or ended, before a text is
# embedded: longer than the gap between the requests of a burst (an agent's
# tool loop, a client at c=1 against a fast provider: a few milliseconds), and
# short beside a model run (2–40 ms a text), so an idle gateway embeds at once.
QUIET_S = 0.010
# The longest a text waits for that quiet. Under continuous traffic the backlog
# still embeds one text per this interval (a short text costs ~3 ms: ~1% of
# such a stream of requests meets a model run).
MAX_DEFER_S = 0.2
# The share of a model run (or of a quiet moment) during which some task of
# the machine waited for a CPU, above which the machine has no core to spare. A
# lone model run on an otherwise idle machine stalls nobody (0); two busy
# programs on two cores beside it stall someone most of the time.
BUSY_STALL_SHARE = 0.2
PRESSURE_FILE = "/proc/pressure/cpu"
_SIZE = 8  # one int64


class CpuPressure:
    """The machine's cumulative CPU stall: how long, in microseconds, at least one
    runnable task waited for a CPU (PSI's ``some total``). ``None`` from
    ``stall_us`` where the kernel has no PSI (then nothing waits on it)."""

    def __init__(self, path: str = PRESSURE_FILE) -> None:
        try:
            self._file: Any = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in close())
        except OSError:
            self._file = None

    def stall_us(self) -> int | None:
        if self._file is None:
            return None
        try:
            self._file.seek(0)
            line = self._file.read(256).split(b"\n", 1)[0]
            return int(line.rsplit(b"total=", 1)[1])
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def busy(stall_us: int | None, stall_before_us: int | None, elapsed_ns: int) -> bool:
    """Whether the machine's tasks waited for a CPU more than ``BUSY_STALL_SHARE``
    of ``elapsed_ns`` (False without PSI, or without time elapsed)."""
    if stall_us is None or stall_before_us is None or elapsed_ns <= 0:
        return False
    return (stall_us - stall_before_us) * 1000 > BUSY_STALL_SHARE * elapsed_ns


class TrafficClock:
    """One shared int64: the monotonic nanoseconds of the last request mark.

    The gateway creates it (``TrafficClock()``) and hands ``fd`` to the child,
    which opens the same page with ``TrafficClock(fd)``. An aligned 8-byte
    store is one instruction on the machines we run on, so the reader never sees
    half a value; if it did, it would misjudge one wait, nothing more.
    """

    def __init__(self, fd: int | None = None) -> None:
        self._file = None
        if fd is None:
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create("lore-traffic")
            else:  # no memfd (macOS): an unlinked temporary file
                self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
                fd = self._file.fileno()
            os.ftruncate(fd, _SIZE)
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)
        self._view = memoryview(self._map).cast("q")

    def mark(self) -> None:
        """A request began or ended (the gateway's side)."""
        self._view[0] = time.monotonic_ns()

    def last_mark_ns(self) -> int:
        return int(self._view[0])

    def wait_quiet(self, *, quiet_s: float = QUIET_S, max_wait_s: float = MAX_DEFER_S,
                   sleep: Callable[[float], None] = time.sleep,
                   pressure: CpuPressure | None = None) -> float:
        """Until no mark for ``quiet_s``, at most ``max_wait_s``; the seconds waited
        (the child's side). With ``pressure`` (the last run found the machine
        busy), also until a stretch of ``quiet_s`` in which the machine's tasks
        waited for a CPU less than ``BUSY_STALL_SHARE`` of the time."""
        start = time.monotonic_ns()
        deadline = start + int(max_wait_s * 1e9)
        quiet_ns = int(quiet_s * 1e9)
        window_at = start
        stall_at = pressure.stall_us() if pressure is not None else None
        while True:
            now = time.monotonic_ns()
            if now >= deadline:
                return (now - start) / 1e9
            quiet_at = self.last_mark_ns() + quiet_ns
            if now < quiet_at:
                sleep((min(quiet_at, deadline) - now) / 1e9)
                continue
            if pressure is None or stall_at is None:
                return (now - start) / 1e9
            if now - window_at < quiet_ns:
                sleep((min(window_at + quiet_ns, deadline) - now) / 1e9)
                continue
            stall = pressure.stall_us()
            if not busy(stall, stall_at, now - window_at):
                return (now - start) / 1e9
            window_at, stall_at = now, stall

    def close(self) -> None:
        """Unmap the page; a mark after this (a request ending during shutdown)
        goes to a private word instead of failing."""
        self._view.release()
        self._view = memoryview(bytearray(_SIZE)).cast("q")
        self._map.close()
        if self._file is not None:
            self._file.close()
        else:
            with contextlib.suppress(OSError):
                os.close(self.fd)
