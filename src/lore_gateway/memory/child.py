"""Helper processes started with ``subprocess``, not ``multiprocessing``.

Every ``multiprocessing`` start method but ``fork`` (never safe in a threaded
gateway) also starts its resource tracker: one more interpreter that sits
beside the gateway for its whole life, 12 MiB of RSS (docs/benchmarks.md,
"Memory"). The ``spawn`` method also runs the parent's ``__main__`` again in
every child, which for the ``lore`` script means importing the whole CLI. Our
children need neither: they talk over pipes and socket pairs whose file
descriptors they inherit, never over queues or shared semaphores.

A child runs ``module:function(*args)`` in a fresh interpreter with the
parent's ``sys.path`` and interpreter flags. The call arrives pickled on its
standard input; the descriptors named in ``fds`` keep their numbers in the
child. ``ChildProcess`` has the part of ``multiprocessing.Process`` our
supervisors use (``pid``, ``is_alive``, ``join``, ``exitcode``, ``terminate``,
``kill``). A child that raises exits with status 1 (after its traceback on
stderr), like a ``multiprocessing`` child; one the parent never stopped is
ended when the parent's interpreter exits, as a daemonic process was.
"""

from __future__ import annotations

import atexit
import contextlib
import pickle
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

# The child's first step, before it can import anything of ours: the parent's
# sys.path (tests and editable installs put the package on it), then the call.
_BOOT = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
         "from lore_gateway.memory.child import _run; _run()")
# How long interpreter exit waits for a child it had to stop (SIGTERM) before
# it kills it.
EXIT_WAIT_S = 5.0

_live: weakref.WeakSet[ChildProcess] = weakref.WeakSet()
_live_lock = threading.Lock()


class ChildProcess:
    """``function(*args)`` of module ``module``, in a child interpreter."""

    def __init__(self, module: str, function: str, args: tuple[Any, ...], *,
                 fds: Iterable[int] = ()) -> None:
        call = pickle.dumps((module, function, args), protocol=pickle.HIGHEST_PROTOCOL)
        flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        command = [sys.executable, *flags, "-c", _BOOT]
        self._popen = subprocess.Popen(command, stdin=subprocess.PIPE,
                                       pass_fds=tuple(fds), close_fds=True)
        stdin = self._popen.stdin
        assert stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died at once: exitcode says so
            pickle.dump(list(sys.path), stdin, protocol=pickle.HIGHEST_PROTOCOL)
            stdin.write(call)
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
        with _live_lock:
            _live.add(self)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """The exit status (negative: the signal that ended it); ``None`` while it runs."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait for the child to end, at most ``timeout`` seconds."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def terminate(self) -> None:
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()


@atexit.register
def _end_children() -> None:
    """Children still running when the parent's interpreter exits (nobody closed
    their supervisor): stop them, as ``multiprocessing`` did its daemonic ones."""
    with _live_lock:
        children = [c for c in _live if c.is_alive()]
    for child in children:
        child.terminate()
    for child in children:
        child.join(EXIT_WAIT_S)
        child.kill()


def _run() -> None:
    """The child's side: read the call from stdin and make it."""
    import importlib

    module, function, args = pickle.load(sys.stdin.buffer)
    target = getattr(importlib.import_module(module), function)
    try:
        target(*args)
    except SystemExit:
        raise
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group
        sys.exit(1)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.exit(1)
    sys.exit(0)
