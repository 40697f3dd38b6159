"""What the pages show, read from the memory database (synchronous; a reader thread).

Every function takes the one tenant the viewer may see and filters on it; there is
no "all tenants" here, so a page can never show another tenant's rows, whatever
URL it was asked for. Rows that a newer or older schema lacks (distillations
before the knowledge migration) read as empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from lore_gateway.storage.base import Connection
from lore_gateway.storage.dialect import table_exists

# Turns that hold a distillation's observations message: shown beside the turns
# they cover, not as turns of their own (distill/store.py).
DISTILL_PROTOCOL = "lore-distill"
# Rows one page lists; more is a "next page" link, never an unbounded read.
PAGE_SIZE = 50
# Messages shown per session page: long sessions page by turns.
TURNS_PER_PAGE = 40

_TOOL_CALL = re.compile(r"^\[tool_call:([^\]]*)\]\s?", re.S)
_TOOL_RESULT = re.compile(r"^\[tool:([^\]]*)\]\s?", re.S)
_REASONING = re.compile(r"^\[reasoning\]\s?", re.S)
REF = re.compile(r"\bt:(\d+)\b")


@dataclass(frozen=True, slots=True)
class Project:
    name: str
    sessions: int
    turns: int
    last_seen: float


@dataclass(frozen=True, slots=True)
class SessionRow:
    session: str
    project: str
    turns: int
    messages: int
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class ShownMessage:
    """A stored message and how the page renders it."""

    id: int
    role: str
    kind: str  # text | tool_call | tool_result | reasoning | observations
    label: str  # the tool name for tool calls and results
    body: str
    tokens: int
    truncated: bool

    @property
    def ref(self) -> str:
        return f"t:{self.id}"


@dataclass(slots=True)
class Recall:
    """One hidden recall round trip: what the model asked and what it got."""

    anchor_id: str
    session: str
    project: str
    protocol: str
    created_at: float
    query: str
    scope: str
    detail_ref: str
    results: str
    refs: list[str] = field(default_factory=list)
    answer: str = ""
    turn_id: int | None = None


@dataclass(slots=True)
class Turn:
    id: int
    created_at: float
    protocol: str
    model: str
    complete: bool
    messages: list[ShownMessage] = field(default_factory=list)
    recalls: list[Recall] = field(default_factory=list)
    distillations: list[Distillation] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Distillation:
    id: int
    generation: int
    text: str
    method: str
    created_at: float
    first_source: int
    last_source: int


def _table_exists(conn: Connection, name: str) -> bool:
    return table_exists(conn, name)


def projects(conn: Connection, tenant: str) -> list[Project]:
    rows = conn.execute(
        "SELECT project, COUNT(*), SUM(turns), MAX(last_seen) FROM sessions"
        " WHERE tenant = ? AND turns > 0 GROUP BY project ORDER BY MAX(last_seen) DESC",
        (tenant,)).fetchall()
    return [Project(str(p), int(n), int(t or 0), float(last or 0)) for p, n, t, last in rows]


def sessions(conn: Connection, tenant: str, project: str | None = None, *,
             offset: int = 0, limit: int = PAGE_SIZE) -> list[SessionRow]:
    where = ""
    args: tuple[str, ...] = (tenant,)
    if project is not None:
        where, args = " AND s.project = ?", (tenant, project)
    rows = conn.execute(
        "SELECT s.id, s.project, s.turns, s.first_seen, s.last_seen,"
        " (SELECT COUNT(*) FROM messages m WHERE m.tenant = s.tenant AND m.session = s.id)"
        f" FROM sessions s WHERE s.tenant = ? AND s.turns > 0{where}"
        " ORDER BY s.last_seen DESC LIMIT ? OFFSET ?", (*args, limit, offset)).fetchall()
    return [SessionRow(str(s), str(p), int(t or 0), int(m or 0), float(f or 0), float(la or 0))
            for s, p, t, f, la, m in rows]


def session_info(conn: Connection, tenant: str, session: str) -> SessionRow | None:
    row = conn.execute(
        "SELECT s.id, s.project, s.turns, s.first_seen, s.last_seen,"
        " (SELECT COUNT(*) FROM messages m WHERE m.tenant = s.tenant AND m.session = s.id)"
        " FROM sessions s WHERE s.tenant = ? AND s.id = ?", (tenant, session)).fetchone()
    if row is None:
        return None
    s, p, t, f, la, m = row
    return SessionRow(str(s), str(p), int(t or 0), int(m or 0), float(f or 0), float(la or 0))


def session_version(conn: Connection, tenant: str, session: str) -> tuple[int, int]:
    """(turns, newest message id) of a session: what the live view watches."""
    row = conn.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM messages"
                       " WHERE tenant = ? AND session = ?", (tenant, session)).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def tenant_version(conn: Connection, tenant: str) -> tuple[int, int]:
    """(newest message id, recalls) of a tenant: what a team member's overview watches."""
    row = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages WHERE tenant = ?",
                       (tenant,)).fetchone()
    recalls = conn.execute("SELECT COUNT(*) FROM recall_anchors WHERE tenant = ?",
                           (tenant,)).fetchone() if _table_exists(conn, "recall_anchors") else None
    return (int(row[0]) if row else 0, int(recalls[0]) if recalls else 0)


def shown(message_id: int, role: str, content: str, tokens: int, truncated: bool) -> ShownMessage:
    """How one stored message is rendered: tool calls and results become collapsible."""
    for kind, pattern in (("tool_call", _TOOL_CALL), ("tool_result", _TOOL_RESULT)):
        found = pattern.match(content)
        if found:
            return ShownMessage(message_id, role, kind, found.group(1), content[found.end():],
                                tokens, truncated)
    if _REASONING.match(content):
        return ShownMessage(message_id, role, "reasoning", "",
                            _REASONING.sub("", content, count=1), tokens, truncated)
    kind = "observations" if role == "observations" else "text"
    return ShownMessage(message_id, role, kind, "", content, tokens, truncated)


def session_turns(conn: Connection, tenant: str, session: str, *,
                  offset: int = 0, limit: int = TURNS_PER_PAGE) -> list[Turn]:
    """A page of the session's turns, oldest first, with their recalls and the
    distillations that cover them."""
    turn_rows = conn.execute(
        "SELECT id, created_at, protocol, COALESCE(model, ''), complete FROM turns"
        " WHERE tenant = ? AND session = ? AND protocol != ? ORDER BY id LIMIT ? OFFSET ?",
        (tenant, session, DISTILL_PROTOCOL, limit, offset)).fetchall()
    turns = [Turn(int(i), float(c), str(p), str(m), bool(done)) for i, c, p, m, done in turn_rows]
    if not turns:
        return []
    by_id = {t.id: t for t in turns}
    marks = ",".join("?" * len(turns))
    for mid, turn_id, role, content, tokens, truncated in conn.execute(
            "SELECT id, turn_id, role, content, tokens, truncated FROM messages"
            f" WHERE tenant = ? AND turn_id IN ({marks}) ORDER BY turn_id, seq",
            (tenant, *by_id)):
        by_id[int(turn_id)].messages.append(
            shown(int(mid), str(role), str(content), int(tokens), bool(truncated)))
    for recall in recalls(conn, tenant, session=session, limit=1000):
        if recall.turn_id in by_id:
            by_id[recall.turn_id].recalls.append(recall)
    for item in distillations(conn, tenant, session):
        # Beside the turn holding its newest source message: where its story ends.
        target = next((t for t in turns if any(m.id == item.last_source for m in t.messages)),
                      None)
        if target is not None:
            target.distillations.append(item)
    return turns


def distillations(conn: Connection, tenant: str, session: str) -> list[Distillation]:
    if not _table_exists(conn, "distillations"):
        return []
    rows = conn.execute(
        "SELECT id, generation, text, method, created_at, source_ids, last_source"
        " FROM distillations WHERE tenant = ? AND session = ? AND archived = 0 ORDER BY id",
        (tenant, session)).fetchall()
    out = []
    for did, gen, text, method, created, source_ids, last in rows:
        ids = [int(i) for i in orjson.loads(str(source_ids) or "[]")] or [int(last)]
        out.append(Distillation(int(did), int(gen), str(text), str(method), float(created),
                                min(ids), int(last)))
    return out


# --- recalls ------------------------------------------------------------------------


def _text_of(value: Any) -> str:
    """The text inside a stored tool result of any of the three protocols."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_text_of(v) for v in value) if t)
    if isinstance(value, dict):
        for key in ("output", "content", "text"):
            if key in value:
                return _text_of(value[key])
    return ""


def _recall(row: tuple[Any, ...]) -> Recall:
    anchor, session, protocol, arguments, result, created, project = row
    try:
        args = orjson.loads(str(arguments))
    except orjson.JSONDecodeError:
        args = {}
    args = args if isinstance(args, dict) else {}
    try:
        results = _text_of(orjson.loads(result))
    except orjson.JSONDecodeError:
        results = ""
    return Recall(anchor_id=str(anchor), session=str(session), project=str(project or ""),
                  protocol=str(protocol), created_at=float(created),
                  query=str(args.get("query") or ""), scope=str(args.get("scope") or ""),
                  detail_ref=str(args.get("id") or ""), results=results,
                  refs=list(dict.fromkeys(f"t:{n}" for n in REF.findall(results))))


_RECALL_SELECT = (
    "SELECT a.anchor_id, a.session, a.protocol, a.arguments, a.tool_result, a.created_at,"
    " s.project FROM recall_anchors a LEFT JOIN sessions s"
    " ON s.tenant = a.tenant AND s.id = a.session")


def recalls(conn: Connection, tenant: str, *, session: str | None = None,
            offset: int = 0, limit: int = PAGE_SIZE) -> list[Recall]:
    """Recalls newest first (a session's: oldest first), each with its turn and answer."""
    if not _table_exists(conn, "recall_anchors"):
        return []
    if session is None:
        rows = conn.execute(f"{_RECALL_SELECT} WHERE a.tenant = ?"
                            " ORDER BY a.created_at DESC LIMIT ? OFFSET ?",
                            (tenant, limit, offset)).fetchall()
    else:
        rows = conn.execute(f"{_RECALL_SELECT} WHERE a.tenant = ? AND a.session = ?"
                            " ORDER BY a.created_at LIMIT ?", (tenant, session, limit)).fetchall()
    found = [_recall(r) for r in rows]
    for item in found:
        _attach_turn(conn, tenant, item)
    return found


def recall(conn: Connection, tenant: str, anchor_id: str) -> Recall | None:
    if not _table_exists(conn, "recall_anchors"):
        return None
    row = conn.execute(f"{_RECALL_SELECT} WHERE a.tenant = ? AND a.anchor_id = ?",
                       (tenant, anchor_id)).fetchone()
    if row is None:
        return None
    item = _recall(row)
    _attach_turn(conn, tenant, item)
    return item


def _attach_turn(conn: Connection, tenant: str, item: Recall) -> None:
    """The turn a recall happened in: the session's last turn begun before it was
    stored (a turn's time is its request's start); its answer is that turn's text."""
    row = conn.execute("SELECT id FROM turns WHERE tenant = ? AND session = ? AND created_at"
                       " <= ? ORDER BY created_at DESC, id DESC LIMIT 1",
                       (tenant, item.session, item.created_at)).fetchone()
    if row is None:
        return
    item.turn_id = int(row[0])
    texts = [str(r[0]) for r in conn.execute(
        "SELECT content FROM messages WHERE tenant = ? AND turn_id = ? AND role = 'assistant'"
        " ORDER BY seq", (tenant, item.turn_id))]
    item.answer = "\n\n".join(t for t in texts if not _TOOL_CALL.match(t)
                              and not _REASONING.match(t))


def message(conn: Connection, tenant: str, message_id: int) -> tuple[str, ShownMessage,
                                                                           float] | None:
    """(session, message, created_at) of one stored message of the tenant."""
    row = conn.execute("SELECT session, role, content, tokens, truncated, created_at"
                       " FROM messages WHERE tenant = ? AND id = ?",
                       (tenant, message_id)).fetchone()
    if row is None:
        return None
    session, role, content, tokens, truncated, created = row
    return (str(session), shown(message_id, str(role), str(content), int(tokens),
                                bool(truncated)), float(created))


def turn_offset(conn: Connection, tenant: str, session: str, turn_id: int) -> int:
    """How many turns of the session come before ``turn_id`` (for the page to link)."""
    row = conn.execute("SELECT COUNT(*) FROM turns WHERE tenant = ? AND session = ? AND id < ?"
                       " AND protocol != ?", (tenant, session, turn_id, DISTILL_PROTOCOL)
                       ).fetchone()
    return int(row[0]) if row else 0


def counts(conn: Connection, tenant: str) -> dict[str, int]:
    """The tenant's own totals for the overview (memory, not traffic)."""
    def one(sql: str) -> int:
        row = conn.execute(sql, (tenant,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    out = {
        "sessions": one("SELECT COUNT(*) FROM sessions WHERE tenant = ? AND turns > 0"),
        "turns": one("SELECT COUNT(*) FROM turns WHERE tenant = ?"),
        "messages": one("SELECT COUNT(*) FROM messages WHERE tenant = ?"),
        "recalls": one("SELECT COUNT(*) FROM recall_anchors WHERE tenant = ?")
        if _table_exists(conn, "recall_anchors") else 0,
        "knowledge": one("SELECT COUNT(*) FROM knowledge WHERE tenant = ?")
        if _table_exists(conn, "knowledge") else 0,
    }
    return out
