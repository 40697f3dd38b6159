"""A loopback TCP relay in front of the test Postgres, which a test can cut: every
open connection is reset and new ones are refused, as when the database host goes
away; ``restore`` lets connections through again."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Relay:
    """``host`` is a name or address, or the directory of a Unix socket (then the
    socket is ``.s.PGSQL.<port>`` in it, as libpq names it)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="pg-relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _reset(client)
                continue
            try:
                upstream = _connect(*self._target)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._cut.is_set():  # cut while this one was being connected
                    _reset(client)
                    _reset(upstream)
                    continue
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every open connection and refuse new ones."""
        with self._lock:
            self._cut.set()
            victims, self._open = self._open, set()
        for sock in victims:
            _reset(sock)

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _connect(host: str, port: int) -> socket.socket:
    if host.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"{host}/.s.PGSQL.{port}")
        return sock
    return socket.create_connection((host, port), timeout=5)


def _reset(sock: socket.socket) -> None:
    """Abort ``sock``: its peer gets a RST (TCP) or end of stream (a Unix socket).

    ``close`` alone is not enough while a pump thread is blocked in ``recv`` on the
    socket: that call keeps the kernel's socket alive, so nothing reaches the peer
    and the connection lives on unforwarded (a client waits on it for ever, and the
    server keeps the session, with its open transaction and locks). ``shutdown``
    of the receiving side wakes that ``recv`` first."""
    with contextlib.suppress(OSError):
        # SO_LINGER 0: close sends a RST, as a vanished host's firewall would.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
