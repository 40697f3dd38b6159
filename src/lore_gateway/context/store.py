"""Per-session context state and the distillations it renders (plain SQL).

One table, ``context_sessions`` (migration ``_V9_CONTEXT`` in storage/schema.py):
a session's planner state as one JSON document (plus its layer, for counting),
so another gateway instance (issue 17) continues the same layout byte for byte.
Plain SQL (``?`` parameters, ``ON CONFLICT ... DO UPDATE``), portable to
Postgres. Synchronous: run on the reader connection or as a writer job.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from lore_gateway.context.planner import Distilled, SessionState
from lore_gateway.distill import store as dstore
from lore_gateway.privacy import redact_private
from lore_gateway.storage.base import Connection

_FIELDS = {f for f in SessionState.__struct_fields__}


def to_json(state: SessionState) -> str:
    """The state as stored. ``request`` is the user's own text, read from the
    client's history: its ``<private>`` spans are stored as ``[private]``
    (``privacy.py``), while the state in memory keeps the exact text, so the
    bytes sent upstream, and the prompt cache, do not change."""
    data = {name: getattr(state, name) for name in SessionState.__struct_fields__}
    data["request"] = redact_private(state.request)[0]
    return orjson.dumps(data).decode()


def from_json(text: str) -> SessionState:
    data = orjson.loads(text)
    values: dict[str, Any] = {k: v for k, v in data.items() if k in _FIELDS}
    if "prefix_ids" in values:
        values["prefix_ids"] = tuple(values["prefix_ids"])
    if "marks" in values:
        values["marks"] = tuple((int(n), float(t)) for n, t in values["marks"])
    return SessionState(**values)


def load(conn: Connection, tenant: str, session: str) -> SessionState | None:
    row = conn.execute("SELECT state FROM context_sessions WHERE tenant = ? AND session = ?",
                       (tenant, session)).fetchone()
    return from_json(str(row[0])) if row else None


def save(conn: Connection, tenant: str, session: str, state: SessionState) -> None:
    conn.execute(
        "INSERT INTO context_sessions(tenant, session, layer, state, updated_at)"
        " VALUES (?,?,?,?,?) ON CONFLICT(tenant, session) DO UPDATE SET"
        " layer = excluded.layer, state = excluded.state, updated_at = excluded.updated_at",
        (tenant, session, state.layer, to_json(state), time.time()))


def distilled(conn: Connection, tenant: str, session: str) -> list[Distilled]:
    """The session's active distillations in order, each dated by its newest source."""
    rows = [d for d in dstore.active(conn, tenant, session) if d.text.strip()]
    last = {d.id: max(d.source_ids) for d in rows if d.source_ids}
    times: dict[int, float] = {}
    ids = sorted(set(last.values()))
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        for mid, created in conn.execute(
                f"SELECT id, created_at FROM messages WHERE id IN ({marks})", chunk):
            times[int(mid)] = float(created)
    return [Distilled(d.id, d.text, d.generation,
                      times.get(last.get(d.id, -1), d.created_at)) for d in rows]


def for_session(conn: Connection, tenant: str | None, session: str) -> SessionState | None:
    """The session's state (any tenant when ``tenant`` is None: the CLI's view)."""
    row = conn.execute("SELECT state FROM context_sessions WHERE session = ? AND"
                       " (? IS NULL OR tenant = ?) ORDER BY updated_at DESC LIMIT 1",
                       (session, tenant, tenant)).fetchone()
    return from_json(str(row[0])) if row else None


def describe(state: SessionState) -> dict[str, Any]:
    """What ``lore status`` and ``lore data show`` print about a session."""
    share = state.cache_read_share
    return {"layer": state.layer, "rewrites": state.rewrites,
            "cache_read_share": None if share is None else round(share, 4),
            "calibrated_tokens_per_byte": round(state.ratio, 4), "samples": state.samples}


def summary(conn: Connection) -> dict[str, Any]:
    """Managed sessions, and the most recently active one (for ``lore status``)."""
    managed = conn.execute("SELECT count(*) FROM context_sessions WHERE layer > 0").fetchone()
    row = conn.execute("SELECT session, state FROM context_sessions ORDER BY updated_at"
                       " DESC LIMIT 1").fetchone()
    latest = {"session": str(row[0]), **describe(from_json(str(row[1])))} if row else None
    return {"sessions_managed": int(managed[0]) if managed else 0, "latest": latest}
