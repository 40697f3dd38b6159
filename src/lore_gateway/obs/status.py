"""What ``lore status`` shows, computed the same way by the gateway and by the CLI.

A running gateway answers ``GET /lore/status`` (loopback clients only) with
``snapshot(settings, live)``: settings, on-disk facts and its own live state. When
no gateway answers, ``lore status`` builds the same document from the settings and
the database file alone, with ``gateway.running = false``.

Other parts add their own section with ``register_section(name, fn)``; ``fn(settings,
live)`` returns a JSON-able dict and runs off the event loop.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway import __version__
from lore_gateway.config import Settings
from lore_gateway.storage.base import Connection

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

log = logging.getLogger("lore.status")

ROUTE = "/lore/status"

Section = Callable[[Settings, "Live | None"], dict[str, Any]]
_SECTIONS: dict[str, Section] = {}


@dataclass(slots=True)
class Live:
    """The running gateway's own facts (absent when computed from disk)."""

    started_at: float = field(default_factory=time.time)
    listen: str = ""
    memory: Memory | None = None
    recall_active: bool = False
    pid: int = field(default_factory=os.getpid)


def register_section(name: str, section: Section) -> None:
    """Add (or replace) a top-level section of the status document."""
    _SECTIONS[name] = section


def snapshot(settings: Settings, live: Live | None = None) -> dict[str, Any]:
    """The whole status document. Blocking (database reads): call it off the loop."""
    document: dict[str, Any] = {
        "gateway": _gateway(settings, live),
        "upstreams": {name: getattr(settings, f"upstream_{name}")
                      for name in ("openai", "chatgpt", "anthropic", "gemini")},
        "data_dir": str(settings.data_dir),
        "database": database_facts(settings),
        "storage": _storage(settings, live),
        "recall": {"enabled": bool(settings.recall and settings.store),
                   "active": live.recall_active if live else None},
        "embeddings": {"enabled": bool(settings.embeddings)},
        "tenancy": settings.tenancy,
    }
    for name, section in _SECTIONS.items():
        try:
            document[name] = section(settings, live)
        except Exception as exc:  # one broken section must not hide the others
            log.warning("status section %s failed: %s", name, exc)
            document[name] = {"error": str(exc)}
    return document


def _gateway(settings: Settings, live: Live | None) -> dict[str, Any]:
    if live is None:
        return {"running": False, "version": __version__, "listen": settings.base_url,
                "uptime_s": None, "pid": None}
    return {"running": True, "version": __version__, "listen": live.listen,
            "uptime_s": round(time.time() - live.started_at, 1), "pid": live.pid}


def _storage(settings: Settings, live: Live | None) -> dict[str, Any]:
    storage: dict[str, Any] = {"enabled": bool(settings.store)}
    memory = live.memory if live else None
    if memory is not None:
        storage["queue_depth"] = memory.queue_depth
        storage["dropped_turns"] = memory.dropped_turns
    return storage


def database_facts(settings: Settings) -> dict[str, Any]:
    """Size and counts of the database; ``exists: false`` before the first start.
    On Postgres ``path`` is the URL (without its password) and ``bytes`` the
    server's size of the database."""
    database = settings.database
    if database.backend == "postgres":
        facts: dict[str, Any] = {"path": database.url, "exists": True, "backend": "postgres"}
    else:
        path = settings.db_path
        facts = {"path": str(path), "exists": path.exists()}
        if not path.exists():
            return facts | {"bytes": 0, "sessions": 0, "turns": 0, "messages": 0,
                            "embedding_backlog": 0}
        size = path.stat().st_size
        for suffix in ("-wal", "-shm"):
            extra = path.with_name(path.name + suffix)
            if extra.exists():
                size += extra.stat().st_size
        facts["bytes"] = size
    from lore_gateway.storage import db

    try:
        conn = db.connect(database, readonly=True)
    except Exception as exc:
        return facts | {"error": f"cannot read it: {exc}"}
    try:
        if database.backend == "postgres":
            facts["bytes"] = _count(conn, "SELECT pg_database_size(current_database())")
        facts["sessions"] = _count(conn, "SELECT COUNT(*) FROM sessions")
        facts["turns"] = _count(conn, "SELECT COUNT(*) FROM turns")
        facts["messages"] = _count(conn, "SELECT COUNT(*) FROM messages")
        facts["embedding_backlog"] = _count(
            conn, "SELECT COUNT(*) FROM messages m WHERE NOT EXISTS "
                  "(SELECT 1 FROM embeddings e WHERE e.message_id = m.id)")
    except Exception as exc:
        facts["error"] = f"cannot read it: {exc}"
    finally:
        conn.close()
    return facts


def _count(conn: Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _worker(settings: Settings, live: Live | None) -> dict[str, Any]:
    """The background LLM worker: on or off, its models, jobs and today's budget left
    per tenant (docs/knowledge.md), read from the settings and the database."""
    from lore_gateway.worker.status import status_from_db

    facts = status_from_db(settings)
    return {"state": "on" if facts["enabled"] else "off", **facts}


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


register_section("worker", _worker)


def _context(settings: Settings, live: Live | None) -> dict[str, Any]:
    """Context management (docs/context.md): its settings, and the latest session's
    layer and cache-read share, from the database."""
    facts: dict[str, Any] = {"enabled": bool(settings.context),
                             "budget_share": settings.context_budget_share,
                             "window": settings.context_window or None}
    if not settings.db_path.exists():
        return facts
    from lore_gateway.context import store as cstore
    from lore_gateway.storage import db

    conn = db.connect(settings.db_path, readonly=True)
    try:
        return facts | cstore.summary(conn)
    except Exception as exc:  # an older database without the table
        return facts | {"error": str(exc)}
    finally:
        conn.close()


register_section("context", _context)


def _amnesia(settings: Settings, live: Live | None) -> dict[str, Any]:
    """Sessions kept out of memory (``lore amnesia``, /ui; memory/data/amnesia.py), from
    the database: the same rows a running gateway follows."""
    if not settings.store:
        return {"on": False}
    from lore_gateway.memory.data import amnesia
    from lore_gateway.storage import db

    database = settings.database
    if database.backend == "sqlite" and not settings.db_path.exists():
        return {"on": False, "entries": []}
    conn = db.connect(database, readonly=True)
    try:
        rows = amnesia.entries(conn)
    finally:
        conn.close()
    return {"on": bool(rows), "gateway_wide": any(a.scope == "all" for a in rows),
            "entries": [{"covers": a.describe(), "scope": a.scope, "tenant": a.tenant,
                         "session": a.session, "since": a.since, "by": a.by} for a in rows]}


register_section("amnesia", _amnesia)


# --- the route -----------------------------------------------------------------------

_LOOPBACK = ("127.", "::1", "::ffff:127.")


def is_loopback(scope: dict[str, Any]) -> bool:
    client = scope.get("client")
    host = str(client[0]) if client else ""
    return host.startswith(_LOOPBACK) or host == "localhost"


async def respond(scope: dict[str, Any], client: Any, settings: Settings, live: Live) -> None:
    """Answer ``GET /lore/status``: the document for loopback clients, 403 otherwise
    (it names paths and counts that are nobody else's business)."""
    import asyncio

    from lore_gateway.errors import error_body

    if not is_loopback(scope):
        await client.respond(403, error_body(
            "forbidden", f"{ROUTE} answers loopback clients only; run `lore status` on the "
            "gateway's machine"))
        return
    server = scope.get("server")
    if server and not live.listen:
        host = f"[{server[0]}]" if ":" in str(server[0]) else server[0]
        live.listen = f"http://{host}:{server[1]}"
    document = await asyncio.to_thread(snapshot, settings, live)
    await client.respond(200, orjson.dumps(document),
                         [(b"content-type", b"application/json")])
