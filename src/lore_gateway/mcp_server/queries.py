"""The reads behind ``search_sessions`` and ``get_message`` (synchronous; reader thread).

Every query takes the one tenant it may see: an MCP caller never reads another
tenant's rows, whatever it asks for. The caller also runs them inside
``storage.base.in_tenant``, so on Postgres row-level security says the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lore_gateway.memory.data.catalog import StoredMessage
from lore_gateway.memory.tenancy.fingerprint import BOILERPLATE_PREFIXES
from lore_gateway.storage.base import Connection

# A session's title is the first line a person wrote in it. Harnesses open a
# conversation with user items of their own (Claude Code's reminders, Codex's
# environment context), so a few user messages are read to get past them.
TITLE_SCAN_MESSAGES = 6
MAX_TITLE_CHARS = 120
# Sessions read for one listing, newest first. A text filter is applied to their
# titles in Python, so this bounds the work of a filter that matches nothing
# (a title is one indexed lookup: 2,000 take well under a second).
MAX_SCANNED_SESSIONS = 2_000

_MESSAGE_COLUMNS = ("m.id, m.turn_id, m.seq, m.role, m.content, m.tokens, m.created_at,"
                    " m.truncated, t.complete")


@dataclass(frozen=True, slots=True)
class SessionLine:
    """One session as ``search_sessions`` lists it."""

    session: str
    project: str
    turns: int
    first_seen: float
    last_seen: float
    title: str


@dataclass(frozen=True, slots=True)
class MessageWindow:
    """A stored message, where it lives, and the messages around it in its session."""

    message: StoredMessage
    session: str
    project: str
    before: tuple[StoredMessage, ...]
    after: tuple[StoredMessage, ...]


def sessions(conn: Connection, tenant: str, *, project: str | None, text: str | None,
             limit: int) -> tuple[list[SessionLine], bool]:
    """The tenant's sessions, newest first, whose title, project or id contains
    ``text`` (any case); and whether more than ``limit`` matched."""
    where, args = "tenant = ? AND turns > 0", [tenant]
    if project:
        where += " AND project = ?"
        args.append(project)
    rows = conn.execute(
        f"SELECT id, project, turns, first_seen, last_seen FROM sessions WHERE {where}"
        " ORDER BY last_seen DESC LIMIT ?", (*args, MAX_SCANNED_SESSIONS)).fetchall()
    needle = text.casefold().strip() if text else ""
    found: list[SessionLine] = []
    for session, proj, turns, first, last in rows:
        title = title_of(conn, tenant, str(session))
        if needle and needle not in f"{title}\n{proj}\n{session}".casefold():
            continue
        found.append(SessionLine(str(session), str(proj), int(turns or 0), float(first or 0),
                                 float(last or 0), title))
        if len(found) > limit:
            break
    return found[:limit], len(found) > limit


def title_of(conn: Connection, tenant: str, session: str) -> str:
    """The first line the user wrote in ``session`` (cut to MAX_TITLE_CHARS), or ``""``."""
    rows = conn.execute(
        "SELECT content FROM messages WHERE tenant = ? AND session = ? AND role = 'user'"
        " ORDER BY id LIMIT ?", (tenant, session, TITLE_SCAN_MESSAGES)).fetchall()
    for (content,) in rows:
        text = str(content).strip()
        if not text or text.startswith(BOILERPLATE_PREFIXES) or text.startswith("[tool"):
            continue
        line = next(line.strip() for line in text.splitlines() if line.strip())
        return line if len(line) <= MAX_TITLE_CHARS else line[:MAX_TITLE_CHARS - 1] + "…"
    return ""


def window(conn: Connection, tenant: str, message_id: int, *, before: int,
           after: int) -> MessageWindow | None:
    """Message ``message_id`` of ``tenant`` with up to ``before`` and ``after``
    messages of its session around it, in conversation order; None if absent."""
    row = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS}, m.session, m.project FROM messages m"
        " JOIN turns t ON t.id = m.turn_id WHERE m.id = ? AND m.tenant = ?",
        (message_id, tenant)).fetchone()
    if row is None:
        return None
    message, session, project = _stored(row[:9]), str(row[9]), str(row[10])
    position = (message.turn_id, message.turn_id, message.seq)
    earlier = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages m JOIN turns t ON t.id = m.turn_id"
        " WHERE m.tenant = ? AND m.session = ? AND (m.turn_id < ? OR (m.turn_id = ?"
        " AND m.seq < ?)) ORDER BY m.turn_id DESC, m.seq DESC LIMIT ?",
        (tenant, session, *position, before)).fetchall() if before > 0 else []
    later = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages m JOIN turns t ON t.id = m.turn_id"
        " WHERE m.tenant = ? AND m.session = ? AND (m.turn_id > ? OR (m.turn_id = ?"
        " AND m.seq > ?)) ORDER BY m.turn_id, m.seq LIMIT ?",
        (tenant, session, *position, after)).fetchall() if after > 0 else []
    return MessageWindow(message, session, project,
                         tuple(_stored(r) for r in reversed(earlier)),
                         tuple(_stored(r) for r in later))


def _stored(row: tuple[Any, ...]) -> StoredMessage:
    i, turn, seq, role, content, tokens, ts, truncated, complete = row
    return StoredMessage(int(i), int(turn), int(seq), str(role), str(content), int(tokens or 0),
                         float(ts), bool(truncated), bool(complete))
