"""A one-way pipe of pickled objects that never blocks the sender's event loop.

``multiprocessing.Queue.put`` wakes a feeder thread per object, and that
thread then takes the GIL from the event loop to pickle and write: measured
with ``py-spy --gil`` at one request at a time, the hand-off of each stored
turn cost more of the loop than the rest of storage's part of the request
path. Here the sender pickles and writes the frame itself, with one
non-blocking ``write``: a turn is a few KB and the pipe holds up to 1 MiB, so
the write normally completes at once. Only when the pipe is full (the child is
behind, or the turn is huge) does the rest go to a bounded backlog that a
sender thread writes out in order.

A frame is a 4-byte little-endian length and a pickle. The receiver reads
whole frames; end of file means the sender (the gateway) is gone.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import pickle
import select
import struct
import threading
from typing import Any

_LENGTH = struct.Struct("<I")
# A bigger pipe keeps a burst of turns off the backlog thread (Linux caps it
# at /proc/sys/fs/pipe-max-size, 1 MiB by default; below that the call fails
# and the 64 KiB default stays).
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
# Bytes read per read call by the receiver.
READ_BYTES = 1 << 20
# The sender thread's wait for room in a full pipe before it checks again
# whether the pipe was closed.
WRITE_WAIT_S = 1.0


class PipeClosed(Exception):
    """The other end of the pipe is gone."""


def make_pipe() -> tuple[int, int]:
    """(read fd, write fd), inheritable by a spawned child, the pipe enlarged."""
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_fd, _F_SETPIPE_SZ, PIPE_BYTES)
    return read_fd, write_fd


class PipeSender:
    """The sending end: ``send`` pickles and writes without blocking."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._lock = threading.Lock()
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._ready = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.error: OSError | None = None

    def send(self, obj: Any) -> None:
        """Queue ``obj`` for the receiver; raises ``PipeClosed`` once it is gone.
        The caller bounds how much is in flight (the backlog is only the part the
        pipe could not take yet)."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        frame = memoryview(_LENGTH.pack(len(data)) + data)
        with self._lock:
            if self._closed or self.error is not None:
                raise PipeClosed(str(self.error or "the pipe is closed"))
            if not self._backlog:
                try:
                    written = os.write(self._fd, frame)
                except BlockingIOError:
                    written = 0
                except OSError as exc:  # EPIPE: the receiver died
                    self.error = exc
                    raise PipeClosed(str(exc)) from exc
                if written == len(frame):
                    return
                frame = frame[written:]
            self._backlog.append(frame)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="lore-store-send",
                                                daemon=True)
                self._thread.start()
            self._ready.notify()

    def _drain(self) -> None:
        """The backlog, written in order as the pipe makes room."""
        while True:
            with self._lock:
                while not self._backlog and not self._closed:
                    self._ready.wait()
                if not self._backlog:
                    return
                frame = self._backlog[0]
            try:
                _, ready, _ = select.select([], [self._fd], [], WRITE_WAIT_S)
                written = os.write(self._fd, frame) if ready else 0
            except BlockingIOError:
                written = 0
            except OSError as exc:
                with self._lock:
                    self.error = exc
                    self._backlog.clear()
                return
            with self._lock:
                if written == len(frame):
                    self._backlog.popleft()
                elif written:
                    self._backlog[0] = frame[written:]

    def close(self) -> None:
        """Let the backlog drain, then close the pipe (the receiver sees EOF)."""
        with self._lock:
            self._closed = True
            self._ready.notify()
            thread = self._thread
        if thread is not None:
            thread.join(WRITE_WAIT_S * 30)
        with contextlib.suppress(OSError):
            os.close(self._fd)


class PipeReceiver:
    """The receiving end: whole objects, in order."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def receive(self, timeout: float) -> list[Any]:
        """The objects that arrived within ``timeout`` (maybe none); raises
        ``PipeClosed`` at end of file."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(self._fd, READ_BYTES)
        if not chunk:
            raise PipeClosed("the gateway closed the pipe")
        self._buffer += chunk
        out: list[Any] = []
        start = 0
        while len(self._buffer) - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer, start)
            end = start + _LENGTH.size + length
            if len(self._buffer) < end:
                break
            out.append(pickle.loads(self._buffer[start + _LENGTH.size:end]))
            start = end
        del self._buffer[:start]
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
