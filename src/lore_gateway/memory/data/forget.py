"""``lore data forget``: delete turns by session, time or text, and all made from them.

A :class:`Selector` names the turns: one session's, those stored since a time,
those with a message containing a text (any case), or the turns all of the given
ones agree on. Deleting a turn deletes its messages, and with them their rows in
both search indexes (the FTS triggers; Postgres's ``search_docs`` by cascade) and
their vectors (``embeddings``, by cascade); the message after each one is indexed
again, since the context index holds a message with its predecessor's text. What
was made from the turns goes too: the distillations built from any of their messages (and each one's
``observations`` message), the recalls kept for replay, the context manager's
state and the frozen knowledge block of the sessions touched (both hold rendered
text), and, with ``match``, every knowledge entry and distillation that contains
the text (with every version in their history, and any version of another entry
that held the text); with ``since``, the knowledge entries the gateway learned
by itself since then, with their history. A session left with no turn of its
own is deleted whole, exactly as ``lore data delete`` does
(``catalog.delete_turns`` and ``distill.store.forget``).

Deleted rows must not linger where a search cannot see them but the file still
holds them: on SQLite the freed pages are overwritten (``secure_delete``) and
both FTS indexes are rewritten (FTS5 keeps a deleted row's terms in its
segments until they are merged); on Postgres the lexemes no row uses any more
leave ``search_terms``. Synchronous: run it as a memory writer job.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import orjson

from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import history, sync
from lore_gateway.memory.data import catalog
from lore_gateway.storage.base import Connection

# Rows per IN (...) list: well under SQLite's bound on parameters, and a short
# step for any reader waiting on the writer.
CHUNK = catalog.DELETE_CHUNK
# Knowledge entries a person wrote: --since never deletes those (only what the
# gateway learned by itself); --match does, when they contain the text.
PERSON_SOURCES = (sync.MANUAL_SOURCE, "lore ui", "lore knowledge edit")
_DURATION = re.compile(r"^(\d+)\s*(s|sec|m|min|h|d|w)$")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Selector:
    """Which turns: every given condition holds (at least one is given)."""

    session: str | None = None
    since: float | None = None
    match: str | None = None

    def __post_init__(self) -> None:
        if self.session is None and self.since is None and not self.match:
            raise ValueError("name what to forget: a session, a time or a text")


@dataclass(slots=True)
class Forgotten:
    """What went (turns and messages of the conversation; observations not counted)."""

    turns: int = 0
    messages: int = 0
    sessions: int = 0
    distillations: int = 0
    knowledge: int = 0
    anchors: int = 0

    def summary(self) -> str:
        counts = ((self.turns, "turn", "turns"), (self.messages, "message", "messages"),
                  (self.sessions, "whole session", "whole sessions"),
                  (self.distillations, "distillation", "distillations"),
                  (self.knowledge, "knowledge entry", "knowledge entries"),
                  (self.anchors, "kept recall", "kept recalls"))
        return ", ".join(f"{n} {one if n == 1 else many}" for i, (n, one, many)
                         in enumerate(counts) if n or i < 2)


def parse_since(text: str, now: float | None = None) -> float:
    """A ``--since`` value as a timestamp: a duration back from now (``30m``, ``2h``,
    ``3d``, ``1w``), ``today``, ``yesterday``, a date or a date and time (ISO 8601;
    local time unless it names its offset). Raises ``ValueError`` with the fix."""
    now = time.time() if now is None else now
    value = text.strip().lower()
    found = _DURATION.match(value)
    if found:
        return now - int(found.group(1)) * _UNITS[found.group(2)]
    if value in ("today", "yesterday"):
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0,
                                                       microsecond=0)
        return (midnight - timedelta(days=1 if value == "yesterday" else 0)).timestamp()
    try:
        moment = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(
            f"--since {text!r} is not a time: give a duration (30m, 2h, 3d, 1w), today, "
            "yesterday, a date (2025-01-31) or a date and time (2025-01-31T14:00, local "
            "time unless it ends in Z or +hh:mm)") from None
    return moment.timestamp()  # a naive datetime is local time


def _like(text: str) -> str:
    """A LIKE pattern that finds ``text`` anywhere (``\\`` escapes)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _contains(column: str) -> str:
    return f"lower({column}) LIKE lower(?) ESCAPE '\\'"


def _tenant(tenant: str | None) -> tuple[str, list[object]]:
    """``tenant = ?`` when one tenant is meant; every tenant (``--all-tenants``) else.
    Written out, not as ``? IS NULL OR``: Postgres cannot type a bare NULL."""
    return ("tenant = ?", [tenant]) if tenant is not None else ("1 = 1", [])


def _turn_filter(tenant: str | None, sel: Selector) -> tuple[str, list[object]]:
    """WHERE over ``turns t`` for the selector (the conversation's turns only)."""
    where = [f"t.protocol != '{dstore.DISTILL_PROTOCOL}'"]
    args: list[object] = []
    if tenant is not None:
        where.append("t.tenant = ?")
        args.append(tenant)
    if sel.session is not None:
        where.append("t.session = ?")
        args.append(sel.session)
    if sel.since is not None:
        where.append("t.created_at >= ?")
        args.append(sel.since)
    if sel.match:
        where.append("EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id AND "
                     + _contains("m.content") + ")")
        args.append(_like(sel.match))
    return " AND ".join(where), args


def preview(conn: Connection, tenant: str | None, sel: Selector) -> tuple[int, int]:
    """(turns, sessions) the selector names, for the confirmation question."""
    where, args = _turn_filter(tenant, sel)
    row = conn.execute("SELECT count(*), count(DISTINCT session) FROM (SELECT DISTINCT"
                       f" t.id, t.tenant, t.session FROM turns t WHERE {where}) x",
                       args).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _chunks(ids: list[int]) -> Iterable[list[int]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start:start + CHUNK]


def _marks(ids: Sequence[object]) -> str:
    return ",".join("?" * len(ids))


def forget(conn: Connection, tenant: str | None, sel: Selector, *, export: bool = True,
           progress: Progress | None = None) -> Forgotten:
    """Delete what ``sel`` names (module docstring); what went. ``export``: rewrite
    the ``.lore.md`` of a project that lost knowledge entries (LORE_EXPORT)."""
    done = Forgotten()
    where, args = _turn_filter(tenant, sel)
    turns = [(int(i), str(t), str(s)) for i, t, s in conn.execute(
        f"SELECT t.id, t.tenant, t.session FROM turns t WHERE {where} ORDER BY t.id", args)]
    touched = sorted({(t, s) for _, t, s in turns})
    ids = [i for i, _, _ in turns]
    gone: dict[int, tuple[str, str]] = {}  # deleted message id -> its (tenant, session)
    with _secure_delete(conn):
        for step, chunk in enumerate(_chunks(ids)):
            with conn:
                gone.update(_messages_of(conn, "turn_id", chunk))
                conn.execute(f"DELETE FROM turns WHERE id IN ({_marks(chunk)})", chunk)
            if progress is not None:
                progress("deleting turns", min(len(ids), (step + 1) * CHUNK), len(ids))
        done.turns, done.messages = len(ids), len(gone)
        with conn:
            done.distillations = _distillations(conn, tenant, sel, touched, gone)
            done.anchors = _anchors(conn, tenant, sel)
            _session_state(conn, tenant, sel, touched)
            projects = _knowledge(conn, tenant, sel, done)
        _reindex_successors(conn, gone)
        done.sessions = _emptied(conn, touched, done)
        if export:
            _export(conn, projects)
        _compact_indexes(conn, progress)
    return done


def _messages_of(conn: Connection, column: str,
                 ids: list[int]) -> dict[int, tuple[str, str]]:
    """Message id -> (tenant, session) of the messages whose ``column`` is in ``ids``."""
    return {int(m): (str(t), str(s)) for m, t, s in conn.execute(
        f"SELECT id, tenant, session FROM messages WHERE {column} IN ({_marks(ids)})", ids)}


def _distillations(conn: Connection, tenant: str | None, sel: Selector,
                   touched: list[tuple[str, str]], gone: dict[int, tuple[str, str]]) -> int:
    """Distillations built from a deleted message (or of the selected session, or
    holding the text), with their observations messages; how many."""
    rows: dict[int, tuple[int | None, list[int], str, str]] = {}
    for t, s in touched:
        for rid, mid, sources, text in conn.execute(
                "SELECT id, message_id, source_ids, text FROM distillations WHERE tenant = ?"
                " AND session = ?", (t, s)):
            rows[int(rid)] = (None if mid is None else int(mid),
                              list(orjson.loads(str(sources))), str(text), s)
    if sel.match:
        who, args = _tenant(tenant)
        for rid, mid, sources, text, s in conn.execute(
                "SELECT id, message_id, source_ids, text, session FROM distillations WHERE"
                f" {who} AND " + _contains("text"), [*args, _like(sel.match)]):
            rows[int(rid)] = (None if mid is None else int(mid),
                              list(orjson.loads(str(sources))), str(text), str(s))
    needle = sel.match.lower() if sel.match else None
    doomed = [rid for rid, (mid, sources, text, _) in rows.items()
              if (mid is not None and mid in gone) or not gone.keys().isdisjoint(sources)
              or (needle is not None and needle in text.lower())]
    for chunk in _chunks(doomed):
        observations = [int(r[0]) for r in conn.execute(
            "SELECT message_id FROM distillations WHERE message_id IS NOT NULL AND id IN"
            f" ({_marks(chunk)})", chunk)]
        for part in _chunks(observations):
            gone.update(_messages_of(conn, "id", part))
        conn.execute("DELETE FROM turns WHERE id IN (SELECT turn_id FROM messages WHERE id IN"
                     f" (SELECT message_id FROM distillations WHERE id IN ({_marks(chunk)})))",
                     chunk)
        conn.execute(f"DELETE FROM distillations WHERE id IN ({_marks(chunk)})", chunk)
    return len(doomed)


def _reindex_successors(conn: Connection, gone: dict[int, tuple[str, str]]) -> None:
    """Index again the message that followed each deleted one in its session: the
    context index holds every message with its predecessor's text (schema v7),
    so until then it would still find the deleted words there."""
    by_session: dict[tuple[str, str], list[int]] = {}
    for mid, where in gone.items():
        by_session.setdefault(where, []).append(mid)
    after: set[int] = set()
    for (t, s), mids in by_session.items():
        for mid in sorted(mids):
            row = conn.execute("SELECT min(id) FROM messages WHERE tenant = ? AND session = ?"
                               " AND id > ?", (t, s, mid)).fetchone()
            if row is not None and row[0] is not None:
                after.add(int(row[0]))
    for chunk in _chunks(sorted(after)):
        with conn:  # the update triggers re-index the row with its current predecessor
            conn.execute(f"UPDATE messages SET content = content WHERE id IN ({_marks(chunk)})",
                         chunk)


def _anchors(conn: Connection, tenant: str | None, sel: Selector) -> int:
    """Recalls kept for replay (``recall_anchors``) that the selector names."""
    who, args = _tenant(tenant)
    where = [who]
    if sel.session is not None:
        where.append("session = ?")
        args.append(sel.session)
    if sel.since is not None:
        where.append("created_at >= ?")
        args.append(sel.since)
    if sel.match:
        where.append(_contains("arguments || assistant || tool_result"))
        args.append(_like(sel.match))
    conn.execute(f"DELETE FROM recall_anchors WHERE {' AND '.join(where)}", args)
    return conn.changes()


def _session_state(conn: Connection, tenant: str | None, sel: Selector,
                   touched: list[tuple[str, str]]) -> None:
    """The context state and frozen knowledge block of every session touched (both
    hold rendered text; the next request starts them again), and any holding the
    text."""
    for t, s in touched:
        for table in ("context_sessions", "knowledge_sessions"):
            conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND session = ?", (t, s))
    if sel.match:
        pattern = _like(sel.match)
        who, args = _tenant(tenant)
        conn.execute(f"DELETE FROM context_sessions WHERE {who} AND " + _contains("state"),
                     [*args, pattern])
        conn.execute(f"DELETE FROM knowledge_sessions WHERE {who} AND ("
                     + _contains("block") + " OR " + _contains("deltas") + ")",
                     [*args, pattern, pattern])


def _knowledge(conn: Connection, tenant: str | None, sel: Selector,
               done: Forgotten) -> set[tuple[str, str]]:
    """Knowledge entries holding the text, or learned since the time; the
    (tenant, project) pairs that lost one."""
    who, args = _tenant(tenant)
    where = [who]
    if sel.match:
        where.append(_contains("title || ' ' || content"))
        args.append(_like(sel.match))
    if sel.since is not None:
        where.append(f"created_at >= ? AND source NOT IN ({_marks(PERSON_SOURCES)})")
        args += [sel.since, *PERSON_SOURCES]
    if len(where) == 1:
        return set()  # entries belong to a project, not to one session
    rows = conn.execute(f"SELECT id, tenant, project FROM knowledge WHERE"
                        f" {' AND '.join(where)}", args).fetchall()
    for rid, rtenant, _ in rows:
        conn.execute("DELETE FROM knowledge WHERE id = ?", (rid,))
        history.forget_entry(conn, str(rtenant), str(rid))
    if sel.match:  # an older version of an entry may hold the text its newest does not
        who, args = _tenant(tenant)
        states = " || ' ' || ".join(f"coalesce({c}, '')" for c in (
            "before_title", "before_content", "title", "content"))
        conn.execute(f"DELETE FROM knowledge_history WHERE {who} AND " + _contains(states),
                     [*args, _like(sel.match)])
    done.knowledge = len(rows)
    return {(str(t), str(p)) for _, t, p in rows}


def _emptied(conn: Connection, touched: list[tuple[str, str]], done: Forgotten) -> int:
    """Sessions left without a turn of their own go whole (``lore data delete``'s
    own two steps); the others keep an honest turn count. How many went whole."""
    whole = 0
    for t, s in touched:
        row = conn.execute("SELECT count(*) FROM turns WHERE tenant = ? AND session = ? AND"
                           f" protocol != '{dstore.DISTILL_PROTOCOL}'", (t, s)).fetchone()
        left = int(row[0]) if row else 0
        if left == 0:
            before = conn.execute("SELECT count(*) FROM distillations WHERE tenant = ? AND"
                                  " session = ?", (t, s)).fetchone()
            catalog.delete_turns(conn, t, session=s)
            dstore.forget(conn, t, session=s)
            if conn.backend == "sqlite":  # the session's scope token names it (schema v4)
                with conn:
                    conn.execute("DELETE FROM search_scopes WHERE kind = 's' AND tenant = ?"
                                 " AND name = ?", (t, s))
            done.distillations += int(before[0]) if before else 0
            whole += 1
        else:
            with conn:
                conn.execute("UPDATE sessions SET turns = ? WHERE tenant = ? AND id = ?",
                             (left, t, s))
    return whole


def _export(conn: Connection, projects: set[tuple[str, str]]) -> None:
    """Rewrite the ``.lore.md`` of each project that lost entries, so the file no
    longer holds them (and the next session does not import them back)."""
    for tenant, project in sorted(projects):
        root = ex.work_tree_root(project)
        if root is not None and (root / ex.FILE_NAME).exists():
            try:
                with conn:
                    sync.export(conn, tenant, project, Path(root), None)
            except OSError:
                continue  # the user sees the file; `lore knowledge export` retries


@contextlib.contextmanager
def _secure_delete(conn: Connection) -> Iterator[None]:
    """SQLite: overwrite freed pages while forgetting, so deleted text does not stay
    in the file's free pages (Postgres's VACUUM reclaims its own)."""
    sqlite = conn.backend == "sqlite"
    if sqlite:
        conn.execute("PRAGMA secure_delete = ON")
    try:
        yield
    finally:
        if sqlite:
            conn.execute("PRAGMA secure_delete = OFF")


def _compact_indexes(conn: Connection, progress: Progress | None) -> None:
    """Take the deleted rows' terms out of the search indexes' storage (module
    docstring). On SQLite this rewrites both FTS indexes: seconds on a large store."""
    if conn.backend == "postgres":
        from lore_gateway.storage.schema_pg import TERMS_LOCK_KEY

        with conn:
            conn.execute(f"SELECT pg_advisory_xact_lock({TERMS_LOCK_KEY})")
            conn.execute("DELETE FROM search_terms WHERE content_docs <= 0 AND"
                         " context_docs <= 0")
        return
    for step, index in enumerate(("messages_fts", "context_fts")):
        if progress is not None:
            progress("rewriting the search index", step, 2)
        with conn:
            conn.execute(f"INSERT INTO {index}({index}) VALUES ('optimize')")
    if progress is not None:
        progress("rewriting the search index", 2, 2)
