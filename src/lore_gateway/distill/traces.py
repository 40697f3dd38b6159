"""Stack traces: what was raised, and where in the user's own code.

A trace is dozens of frames; a later session needs two facts from it: the
decisive line (exception and message, or the panic) and the innermost frame of
the project's own code (file:line). Library frames (site-packages, node_modules,
node:internal, the JDK, GOROOT, the Go and Cargo module caches) are skipped.

The orders differ. Python prints the outermost frame first and the exception
last, so its reader keeps the last user frame it saw. JS/Node, Java, Go and the
test runners print the exception first and the innermost frame next, so their
reader opens a trace at the exception and takes the first user frame that
follows within ``FRAME_WINDOW`` lines. A Rust panic line carries its location.

``TraceReader`` is fed one line at a time (sans-IO) and says whether the line
belonged to a trace, so the caller reads it no further.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Lines after an exception in which its innermost frame may still appear: jest
# and vitest print a code excerpt of about a dozen lines between the two.
FRAME_WINDOW = 30

_PY_START_RE = re.compile(r"^(\s*)Traceback \(most recent call last\):$")
_PY_FRAME_RE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>\S+))?')
_PY_CHAIN_RE = re.compile(r"^(?:During handling of the above exception|The above exception was)")
_PY_EXCEPTION_RE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
# An exception line, any language: a dotted name ending in Error/Exception/…, an
# optional Node code ([ERR_ASSERTION]) and the message. Java's "Exception in thread"
# and a browser's "Uncaught" are dropped.
_EXCEPTION_RE = re.compile(
    r"^(?:Uncaught\s+|Exception in thread \"[^\"]*\"\s+)?"
    r"(?P<exc>(?:[\w$]+\.)*(?:(?:[A-Z]\w*)?(?:Error|Exception|Failure)|[A-Z]\w*(?:Interrupt|Exit))"
    r"(?:\s\[\w+\])?(?::\s?.*)?)$")
_CAUSE_RE = re.compile(r"^Caused by: (?P<exc>.+)$")
# pytest: "E   ValueError: …" lines, then "path.py:11: ValueError" at the crash site.
_PYTEST_E_RE = re.compile(r"^E\s+(?P<text>.+)$")
_PYTEST_AT_RE = re.compile(r"^(?P<path>\S+\.py):(?P<line>\d+): (?P<exc>[\w.]+)$")
# jest / bun: "expect(received).toBe(expected)", then Expected: / Received: lines.
_EXPECT_RE = re.compile(r"^(?:error: )?(?P<exc>expect\(.+?\)\.\w+\(.*?\))(?:\s*//.*)?$")
_DETAIL_RE = re.compile(r"^(?P<text>(?:Expected|Received|left|right): .+)$")
_GO_PANIC_RE = re.compile(r"^(?P<exc>panic: .+?)(?: \[recovered\])?$")
_GO_FUNC_RE = re.compile(r"^(?:created by )?(?P<fn>\S+?)(?:\([^()]*\))?(?: in goroutine \d+)?$")
_GO_FILE_RE = re.compile(r"^(?P<path>\S+\.go):(?P<line>\d+)(?: \+0x[0-9a-f]+)?$")
_GO_NOISE_RE = re.compile(r"^(?:goroutine \d+ \[.+\]:|\[signal .+\]|exit status \d+)$")
_RUST_PANIC_RE = re.compile(
    r"^thread '(?P<thread>[^']+)'(?: \(\d+\))? panicked at (?:(?P<old>'.*', \S+)|(?P<at>\S+?):)$")
_RUST_NOISE_RE = re.compile(r"^(?:\d+: .+|stack backtrace:|note: .+backtrace.*)$")
_JS_FRAME_RE = re.compile(
    r"^at (?:(?P<fn>.+?) \()?(?P<path>[^()\s]+?):(?P<line>\d+(?::\d+)?)\)?$")
_VITEST_FRAME_RE = re.compile(r"^❯ (?:(?P<fn>\S+) )?(?P<path>[^\s()]+?):(?P<line>\d+:\d+)$")
_JAVA_FRAME_RE = re.compile(r"^at (?P<fn>[\w$.<>/]+)\((?P<path>[^():]+?)(?::(?P<line>\d+))?\)$")
_JAVA_MORE_RE = re.compile(r"^\.\.\. \d+ (?:more|common frames omitted)$")

_LIBRARY_PATH_RE = re.compile(
    r"site-packages/|dist-packages/|/lib/python\d|^<|node_modules/|^node:|^internal/|"
    r"/pkg/mod/|/vendor/|^/rustc/|/\.cargo/registry/|/\.rustup/|"
    r"/go[\w.-]*/src/[^/.]+/.*\.(?:go|s)$")
_LIBRARY_JAVA_RE = re.compile(
    r"^(?:java|javax|jdk|sun|com\.sun|kotlin|scala|org\.junit|org\.opentest4j|junit|"
    r"org\.apache\.maven|org\.gradle)\.|^java\.\w+/")


@dataclass(frozen=True, slots=True)
class Frame:
    path: str
    line: str  # "15", or "15:24" with the column
    function: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" + (f" in {self.function}" if self.function else "")


@dataclass(frozen=True, slots=True)
class Trace:
    """One raised error: its decisive line and, when visible, the user's frame."""

    at: int  # index of the output line it started on
    exception: str
    frame: Frame | None = None
    cause: str = ""  # Java's last "Caused by:" (the root cause)
    cause_frame: Frame | None = None
    located: bool = False  # the decisive line names its own location (a Rust panic)

    def __str__(self) -> str:
        text = self.exception + (f" (at {self.frame})" if self.frame else "")
        if self.cause:
            text += f"; caused by {self.cause}"
            text += f" (at {self.cause_frame})" if self.cause_frame else ""
        return text


class TraceReader:
    """Reads the traces in one output, line by line; ``close`` returns them in order."""

    def __init__(self) -> None:
        self._done: list[Trace] = []
        self._open: Trace | None = None  # an exception whose frames may follow
        self._python: str | None = None  # the traceback's indent, while inside one
        self._python_at = 0
        self._py_frame: Frame | None = None
        self._go_function = ""
        self._pytest_message: tuple[int, str] | None = None  # "E assert …" awaiting its site
        self._ended_at = -2  # the line the last exception was read on

    def feed(self, index: int, line: str) -> bool:
        """Read output line ``index`` (right-stripped); True when it belonged to a trace."""
        text = line.strip()
        if self._open is not None and index - self._open.at > FRAME_WINDOW:
            self._finish()
        if self._python is not None and self._python_line(index, line, text):
            return True
        start = _PY_START_RE.match(line)
        if start or _PY_FRAME_RE.match(line):
            self._finish()
            if self._done and self._ended_at == index - 1:
                # unittest's loader: "ImportError: Failed to import test module: x"
                # heads the traceback that says what failed; the traceback stands.
                self._done.pop()
            self._python, self._python_at, self._py_frame = (
                start.group(1) if start else line[: len(line) - len(line.lstrip())]), index, None
            if not start:
                self._python_line(index, line, text)
            return True
        return bool(text) and (self._opening(index, text) or self._continuing(text))

    def close(self) -> list[Trace]:
        self._finish()
        if self._python is not None and self._py_frame is not None:
            # A traceback cut off before its exception line still says where.
            self._done.append(Trace(self._python_at, "Traceback (cut off)", self._py_frame))
        self._python = None
        return sorted(self._done, key=lambda t: t.at)

    def _python_line(self, index: int, line: str, text: str) -> bool:
        """Inside a Python traceback: frames, source lines, then the exception."""
        frame = _PY_FRAME_RE.match(line)
        if frame:
            found = Frame(frame.group("path"), frame.group("line"), frame.group("fn") or "")
            if not _LIBRARY_PATH_RE.search(found.path):
                self._py_frame = found
            return True
        indent = self._python or ""
        if not text or (line.startswith(indent + " ") and not _PY_CHAIN_RE.match(text)):
            return True  # source lines and carets under a frame
        found_exception = _PY_EXCEPTION_RE.match(text)
        if found_exception:
            self._done.append(Trace(self._python_at, text, self._py_frame))
            self._ended_at = index
        self._python, self._py_frame = None, None
        return bool(found_exception)

    def _opening(self, index: int, text: str) -> bool:
        """A line that starts a trace: exception, panic, expectation, pytest E line."""
        rust = _RUST_PANIC_RE.match(text)
        if rust:
            where = rust.group("old") or f"{rust.group('at')}:"
            self._start(Trace(index, f"thread '{rust.group('thread')}' panicked at {where}",
                              located=True))
            return True
        pytest = _PYTEST_E_RE.match(text)
        if pytest:
            message = pytest.group("text")
            exception = _EXCEPTION_RE.match(message)
            if exception:
                self._start(Trace(index, exception.group("exc")))
            elif self._pytest_message is None and self._open is None:
                self._pytest_message = (index, message)
            return True
        for pattern in (_GO_PANIC_RE, _EXPECT_RE, _EXCEPTION_RE):
            found = pattern.match(text)
            if found:
                self._start(Trace(index, found.group("exc")))
                return True
        return False

    def _continuing(self, text: str) -> bool:
        """A line that only means something after an opening: frames, causes, details."""
        at = _PYTEST_AT_RE.match(text)
        if at:
            self._pytest_site(Frame(at.group("path"), at.group("line")), at.group("exc"))
            return True
        current = self._open
        if current is None:
            return self._frame(text)[0]  # a stray frame is noise all the same
        if current.located:
            return self._rust_line(current, text)
        matched, frame = self._frame(text)
        if current.exception.endswith(":") and not matched:
            # The message goes on below (node's assert: "...strictly equal:" / "90 !== 80").
            self._open = replace(current, exception=f"{current.exception} {text}")
            return True
        detail = _DETAIL_RE.match(text)
        if detail and current.frame is None and not current.cause:
            glue = ", " if ": Expected" in current.exception else ": "
            self._open = replace(current, exception=current.exception + glue + detail["text"])
            return True
        cause = _CAUSE_RE.match(text)
        if cause:
            self._open = replace(current, cause=cause.group("exc"), cause_frame=None)
            return True
        if frame is not None:
            if current.cause and current.cause_frame is None:
                self._open = replace(current, cause_frame=frame)
            elif not current.cause and current.frame is None:
                self._open = replace(current, frame=frame)
        return matched or bool(_GO_NOISE_RE.match(text) or _JAVA_MORE_RE.match(text))

    def _rust_line(self, current: Trace, text: str) -> bool:
        """After a Rust panic: its message (new format), left/right, the backtrace."""
        if current.exception.endswith(":"):
            self._open = replace(current, exception=f"{current.exception} {text}")
            return True
        detail = _DETAIL_RE.match(text)
        if detail:
            glue = ", " if " left: " in current.exception else ": "
            self._open = replace(current, exception=current.exception + glue + detail["text"])
            return True
        return bool(_RUST_NOISE_RE.match(text) or _JS_FRAME_RE.match(text))

    def _frame(self, text: str) -> tuple[bool, Frame | None]:
        """Whether ``text`` is a frame line, and the frame when it is the user's own."""
        java = _JAVA_FRAME_RE.match(text)
        if java:
            if _LIBRARY_JAVA_RE.match(java["fn"]) or not java["line"]:
                return True, None
            return True, Frame(java["path"], java["line"], java["fn"])
        found = (_JS_FRAME_RE.match(text) or _VITEST_FRAME_RE.match(text)
                 or _GO_FILE_RE.match(text))
        if found:
            function = found["fn"] if "fn" in found.groupdict() else self._go_function
            frame = Frame(found["path"], found["line"], function or "")
            return True, None if _LIBRARY_PATH_RE.search(frame.path) else frame
        if self._open is not None and self._open.exception.startswith("panic: "):
            go_function = _GO_FUNC_RE.match(text)
            if go_function:
                self._go_function = go_function["fn"]
                return True, None
        return False, None

    def _pytest_site(self, frame: Frame, exception: str) -> None:
        """pytest's "path.py:11: ValueError": where the E lines above it were raised."""
        if self._open is not None and self._open.frame is None:
            self._open = replace(self._open, frame=frame)
        elif self._pytest_message is not None:
            at, message = self._pytest_message
            self._done.append(Trace(at, f"{exception}: {message}", frame))
        self._pytest_message = None
        self._finish()

    def _start(self, trace: Trace) -> None:
        self._finish()
        self._open, self._go_function, self._ended_at = trace, "", trace.at

    def _finish(self) -> None:
        if self._open is not None:
            self._done.append(self._open)
        self._open = None
