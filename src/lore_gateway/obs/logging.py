"""Structured logs: human-readable by default, one JSON object per line on request.

Both structlog loggers and plain stdlib loggers (uvicorn, aiohttp, the memory
writer) go through the same processor chain, so every line gets the same
timestamp, level, request tags and credential redaction whoever wrote it.

Request tagging uses ``contextvars``: the ASGI handler calls ``bind_request()``
when a request starts (each request runs in its own task, so tags never leak
between requests) and ``bind_session()`` once identity is known. Session ids are
cut to 16 characters, as in the reference gateway's diagnostics (lore-spec F.3).

Logs never carry payloads or credentials. Callers must not log bodies or headers;
``redact`` is the last line of defence for what slips through: values under
credential-looking keys are replaced whole, and credential-shaped substrings
(Bearer tokens, ``sk-…`` keys, JWTs) are cut out of every string.
"""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import Any


def _import_structlog_without_rich() -> None:
    """Import structlog with ``rich`` hidden from it. ``structlog.dev`` imports rich's
    traceback renderer (and pygments with it) when rich is installed, only to offer
    it as ConsoleRenderer's exception formatter; here tracebacks are rendered to a
    string before redaction (``_render_exception_then_redact``), so it never runs.
    Hidden, it costs the gateway 2.4 MiB of RSS less (docs/benchmarks.md "Memory").
    rich stays importable (or imported) for the CLI's own output."""
    if "structlog" in sys.modules:
        return
    rich = sys.modules.get("rich")
    sys.modules["rich"] = None  # type: ignore[assignment]  # import rich -> ImportError
    try:
        import structlog  # noqa: F401
    finally:
        if rich is None:
            del sys.modules["rich"]
        else:
            sys.modules["rich"] = rich


_import_structlog_without_rich()

import structlog  # noqa: E402
from structlog.typing import EventDict, Processor, WrappedLogger  # noqa: E402

from lore_gateway.headers import is_credential  # noqa: E402
from lore_gateway.memory.store.sanitize import REDACTED, redact_credentials, storable  # noqa: E402
from lore_gateway.storage.db import private_dir  # noqa: E402

SESSION_TAG_CHARS = 16
# The log file is for `lore logs`, not an archive: 10 MiB x (1 + 3 rotated files).
LOG_FILE_MAX_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 3

_HANDLER_MARK = "_lore_handler"


def _is_credential_key(key: str) -> bool:
    return is_credential(key)


def _scrub(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        # storable: a client-chosen id with a lone surrogate must not make the
        # UTF-8 log file raise on every line that carries it.
        return storable(redact_credentials(value))
    if depth >= 4:
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _is_credential_key(k) else _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub(v, depth + 1) for v in value]
    return value


def redact(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: remove anything credential-like from the event."""
    for key in list(event_dict):
        if _is_credential_key(key):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


def _render_exception_then_redact(
    logger: WrappedLogger, method: str, event_dict: EventDict
) -> EventDict:
    # Tracebacks are rendered into a string first so that redaction sees them:
    # an exception message can quote a header value.
    event_dict = structlog.processors.format_exc_info(logger, method, event_dict)
    # uvicorn passes a copy of its message with ANSI colours as an "extra".
    event_dict.pop("color_message", None)
    return redact(logger, method, event_dict)


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=False),
        structlog.stdlib.ExtraAdder(),
    ]


def _formatter(fmt: str, *, colors: bool) -> structlog.stdlib.ProcessorFormatter:
    renderer: Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=colors)
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_shared_processors(),
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _render_exception_then_redact,
            renderer,
        ],
    )


def log_file_path(data_dir: Path) -> Path:
    """Where the gateway writes its log, and where `lore logs` reads it."""
    return data_dir / "logs" / "gateway.log"


def configure_logging(level: str = "info", fmt: str = "text", log_file: Path | None = None) -> None:
    """Route all logging to stderr and, when given, to a size-bounded rotating file.

    ``fmt`` is ``"text"`` (human-readable, the default) or ``"json"`` (one object per
    line). Safe to call again: handlers installed by an earlier call are replaced.
    """
    fmt = fmt.lower()
    if fmt not in ("text", "json"):
        raise ValueError(f"unknown log format {fmt!r}: set LORE_LOG_FORMAT to 'text' or 'json'")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(
            f"unknown log level {level!r}: set LORE_LOG_LEVEL to debug, info, warning or error"
        )

    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )

    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
        handler.close()

    handlers: list[logging.Handler] = []
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(_formatter(fmt, colors=fmt == "text" and sys.stderr.isatty()))
    handlers.append(stderr)
    if log_file is not None:
        private_dir(log_file.parent.parent)  # the data dir, when created here first
        private_dir(log_file.parent)
        file_handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=LOG_FILE_MAX_BYTES, backupCount=LOG_FILE_BACKUPS,
            encoding="utf-8",
        )
        file_handler.setFormatter(_formatter(fmt, colors=False))
        handlers.append(file_handler)
    for handler in handlers:
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    root.setLevel(numeric)
    # uvicorn installs its own handlers unless told not to; send its records to ours.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True


def get_logger(name: str | None = None) -> Any:
    """A structlog logger; keyword arguments become fields (never pass payloads)."""
    return structlog.stdlib.get_logger(name)


# Request ids tag log lines: unique within a run (a counter) and across runs (a
# random prefix drawn once), without a random draw per request (uuid4 is a
# getrandom syscall and a few microseconds on every request of the hot path).
_RUN_PREFIX = os.urandom(4).hex()
_REQUEST_COUNTER = itertools.count(1)


def new_request_id() -> str:
    return f"{_RUN_PREFIX}{next(_REQUEST_COUNTER) & 0xFFFFFFFF:08x}"


def bind_request(request_id: str | None = None) -> str:
    """Tag every log line of the current request (task) with its id; return the id."""
    rid = request_id or new_request_id()
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=rid)
    return rid


def bind_session(session_id: str) -> None:
    """Add the (truncated) session id to the current request's log lines."""
    structlog.contextvars.bind_contextvars(session=session_id[:SESSION_TAG_CHARS])

