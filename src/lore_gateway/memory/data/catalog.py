"""Read and delete queries behind ``lore data`` and the recall detail lookup.

Every query takes the tenant it may see; ``None`` means "every tenant" and is only
reachable from the local CLI with an explicit ``--all-tenants``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lore_gateway.storage.base import Connection

# lore-spec B.4/B.5: a detail window defaults to 12,000 and is at most 16,000
# code points, so one lookup fits in a tool result.
DETAIL_DEFAULT_CHARS = 12_000
DETAIL_MAX_CHARS = 16_000
# Rows deleted per statement: keeps each step short so a reader is never blocked
# for long and a progress bar has something to show.
DELETE_CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class SessionSummary:
    tenant: str
    project: str
    session: str
    turns: int
    messages: int
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class TenantSummary:
    tenant: str
    sessions: int
    messages: int
    last_seen: float


@dataclass(frozen=True, slots=True)
class StoredMessage:
    id: int
    turn_id: int
    seq: int
    role: str
    content: str
    tokens: int
    created_at: float
    truncated: bool
    complete: bool

    @property
    def ref(self) -> str:
        return f"t:{self.id}"


def _tenant_clause(tenant: str | None, column: str = "tenant") -> tuple[str, tuple[Any, ...]]:
    return ("", ()) if tenant is None else (f" AND {column} = ?", (tenant,))


def tenants(conn: Connection) -> list[TenantSummary]:
    rows = conn.execute(
        "SELECT s.tenant, COUNT(*), MAX(s.last_seen),"
        " (SELECT COUNT(*) FROM messages m WHERE m.tenant = s.tenant)"
        " FROM sessions s WHERE s.turns > 0 GROUP BY s.tenant ORDER BY MAX(s.last_seen) DESC"
    ).fetchall()
    return [TenantSummary(_s(t), _i(n), _i(msgs), _f(last)) for t, n, last, msgs in rows]


def sessions(
    conn: Connection, tenant: str | None, *, project: str | None = None
) -> list[SessionSummary]:
    where, args = _tenant_clause(tenant, "s.tenant")
    if project is not None:
        where += " AND s.project = ?"
        args += (project,)
    rows = conn.execute(
        "SELECT s.tenant, s.project, s.id, s.turns, s.first_seen, s.last_seen,"
        " (SELECT COUNT(*) FROM messages m WHERE m.tenant = s.tenant AND m.session = s.id)"
        f" FROM sessions s WHERE s.turns > 0{where} ORDER BY s.last_seen DESC",
        args,
    ).fetchall()
    return [
        SessionSummary(_s(t), _s(p), _s(s), _i(turns), _i(msgs), _f(first), _f(last))
        for t, p, s, turns, first, last, msgs in rows
    ]


def session_messages(
    conn: Connection, tenant: str | None, session: str
) -> list[StoredMessage]:
    where, args = _tenant_clause(tenant, "m.tenant")
    rows = conn.execute(
        "SELECT m.id, m.turn_id, m.seq, m.role, m.content, m.tokens, m.created_at, m.truncated,"
        " t.complete FROM messages m JOIN turns t ON t.id = m.turn_id"
        f" WHERE m.session = ?{where} ORDER BY m.turn_id, m.seq",
        (session, *args),
    ).fetchall()
    return [_stored(row) for row in rows]


def message(conn: Connection, message_id: int, tenant: str) -> StoredMessage | None:
    row = conn.execute(
        "SELECT m.id, m.turn_id, m.seq, m.role, m.content, m.tokens, m.created_at, m.truncated,"
        " t.complete FROM messages m JOIN turns t ON t.id = m.turn_id"
        " WHERE m.id = ? AND m.tenant = ?",
        (message_id, tenant),
    ).fetchone()
    return None if row is None else _stored(row)


def _stored(row: tuple[Any, ...]) -> StoredMessage:
    i, turn, seq, role, content, tokens, ts, trunc, done = row
    return StoredMessage(_i(i), _i(turn), _i(seq), _s(role), _s(content), _i(tokens), _f(ts),
                         bool(trunc), bool(done))


def _i(value: Any) -> int:
    if not isinstance(value, int):
        raise TypeError(f"expected an integer column, got {value!r}")
    return value


def _f(value: Any) -> float:
    if not isinstance(value, int | float):
        raise TypeError(f"expected a numeric column, got {value!r}")
    return float(value)


def _s(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a text column, got {value!r}")
    return value


# --- detail --------------------------------------------------------------------------


def detail_text(
    conn: Connection, ref: str, tenant: str, offset: int = 0,
    limit: int = DETAIL_DEFAULT_CHARS, now: float | None = None,
) -> str:
    """The lore-spec B.4 detail block for ``t:<id>``: one window of the full content."""
    prefix, sep, rest = ref.partition(":")
    if not sep:
        return f"No entry found for id: {ref}"
    if prefix != "t":
        return f'Unknown source prefix "{prefix}" in id: {ref}'
    found = message(conn, int(rest), tenant) if rest.isdigit() else None
    if found is None:
        return f"No entry found for id: {ref}"
    limit = max(1, min(limit, DETAIL_MAX_CHARS))
    offset = max(0, offset)
    total = len(found.content)
    window = found.content[offset:offset + limit]
    end = offset + len(window)
    lines = [
        f"## Recall Detail: {ref}",
        "#### Conversation",
        f"- ({found.role}, {age(found.created_at, now)})",
        window,
    ]
    if end < total:
        lines.append(
            f"\n[Showing characters {offset}–{end} of {total}. "
            f"Call recall with id {ref} and detailOffset {end} for the rest.]"
        )
    elif offset > 0:
        lines.append(f"\n[Showing characters {offset}–{end} of {total}.]")
    return "\n".join(lines)


def age(created_at: float, now: float | None = None) -> str:
    seconds = max(0.0, (time.time() if now is None else now) - created_at)
    if seconds < 3600:
        return f"{int(seconds // 60)}m ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h ago"
    return f"{int(seconds // 86400)}d ago"


# --- deletion (run on the writer thread) ---------------------------------------------

Progress = Callable[[int, int], None]


def count_turns(conn: Connection, tenant: str | None, *, session: str | None = None,
                project: str | None = None) -> int:
    where, args = _selector(tenant, session, project)
    row = conn.execute(f"SELECT COUNT(*) FROM turns WHERE {where}", args).fetchone()
    return _i(row[0]) if row is not None else 0


def delete_turns(conn: Connection, tenant: str | None, *, session: str | None = None,
                 project: str | None = None, progress: Progress | None = None) -> int:
    """Delete the turns of one session or project (messages, FTS rows and vectors follow
    through ON DELETE CASCADE and the FTS trigger); return how many turns went."""
    where, args = _selector(tenant, session, project)
    total = count_turns(conn, tenant, session=session, project=project)
    done = 0
    while True:
        with conn:
            ids = [row[0] for row in conn.execute(
                f"SELECT id FROM turns WHERE {where} LIMIT {DELETE_CHUNK}", args)]
            if not ids:
                break
            marks = ",".join("?" * len(ids))
            conn.execute(f"DELETE FROM turns WHERE id IN ({marks})", ids)
        done += len(ids)
        if progress is not None:
            progress(done, total)
    where, args = _selector(tenant, session, project, session_column="id")
    with conn:
        # Recalls kept for replay carry stored text too; they go with their sessions.
        conn.execute("DELETE FROM recall_anchors WHERE (tenant, session) IN "
                     f"(SELECT tenant, id FROM sessions WHERE {where})", args)
        conn.execute(f"DELETE FROM sessions WHERE {where}", args)
    return done


def _selector(tenant: str | None, session: str | None, project: str | None, *,
              session_column: str = "session") -> tuple[str, tuple[Any, ...]]:
    if session is not None and project is None:
        where, args = f"{session_column} = ?", (session,)
    elif project is not None and session is None:
        where, args = "project = ?", (project,)
    else:
        raise ValueError("delete needs exactly one of session or project")
    extra, extra_args = _tenant_clause(tenant)
    return where + extra, args + extra_args
