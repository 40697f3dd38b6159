"""Distillations in the database (synchronous; run on the writer or reader thread).

A distillation is a row in ``distillations`` and, for search and browsing, an
``observations`` message in its session (the search triggers index it, recall
finds it, ``lore data show`` lists it). Its ``source_ids`` are the raw message ids
it came from; the message text ends with them as recall ids, so a result that
cites a distillation leads to its sources.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.distill import extractive
from lore_gateway.distill import format as fmt
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.knowledge import history
from lore_gateway.storage.base import Connection
from lore_gateway.storage.dialect import json_field

OBSERVATIONS_ROLE = "observations"
DISTILL_PROTOCOL = "lore-distill"
# A segment is cut at this many tokens even when more are undistilled, so one
# distillation never has to read an unbounded input.
MAX_SEGMENT_TOKENS = fmt.SEGMENT_TOKENS
# Messages read per segment query (each capped at the store's message size).
MAX_SEGMENT_MESSAGES = 2_000
# Side-channel turns (titles, classifier calls) are stored but never distilled.
def _not_side(conn: Connection, column: str = "meta") -> str:
    return f" AND ({column} IS NULL OR {json_field(conn, column, 'side_channel')} IS NULL)"


@dataclass(frozen=True, slots=True)
class Distillation:
    id: int
    tenant: str
    project: str
    session: str
    generation: int
    text: str
    source_ids: list[int]
    input_tokens: int
    output_tokens: int
    method: str
    created_at: float
    archived: bool


def last_source(conn: Connection, tenant: str, session: str) -> int:
    row = conn.execute("SELECT max(last_source) FROM distillations WHERE tenant = ?"
                       " AND session = ?", (tenant, session)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def undistilled_tokens(conn: Connection, tenant: str, session: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(tokens), 0) FROM messages WHERE tenant = ? AND session = ?"
        " AND id > ? AND role != ?" + _not_side(conn),
        (tenant, session, last_source(conn, tenant, session), OBSERVATIONS_ROLE)).fetchone()
    return int(row[0]) if row else 0


def project_of(conn: Connection, tenant: str, session: str) -> str | None:
    row = conn.execute("SELECT project FROM messages WHERE tenant = ? AND session = ?"
                       " ORDER BY id DESC LIMIT 1", (tenant, session)).fetchone()
    return str(row[0]) if row else None


def next_segment(conn: Connection, tenant: str, session: str,
                 max_tokens: int = MAX_SEGMENT_TOKENS) -> list[SourceMessage]:
    """The oldest undistilled messages of a session, up to ``max_tokens`` (at least one)."""
    rows: list[Any] = conn.execute(
        "SELECT id, role, content, created_at, tokens FROM messages WHERE tenant = ?"
        " AND session = ? AND id > ? AND role != ?" + _not_side(conn) + " ORDER BY id LIMIT ?",
        (tenant, session, last_source(conn, tenant, session), OBSERVATIONS_ROLE,
         MAX_SEGMENT_MESSAGES)).fetchall()
    out: list[SourceMessage] = []
    used = 0
    for mid, role, content, created_at, tokens in rows:
        if out and used + int(tokens) > max_tokens:
            break
        out.append(SourceMessage(int(mid), str(role), str(content), float(created_at)))
        used += int(tokens)
    return out


def sessions_with_undistilled(conn: Connection, tenant: str | None) -> list[tuple[str, str]]:
    """(tenant, session) pairs that have messages newer than their last distillation."""
    rows = conn.execute(
        "SELECT m.tenant, m.session FROM messages m WHERE (?1 IS NULL OR m.tenant = ?1)"
        " AND m.role != ?2" + _not_side(conn, "m.meta") + " GROUP BY m.tenant, m.session"
        " HAVING max(m.id) > coalesce("
        "(SELECT max(d.last_source) FROM distillations d WHERE d.tenant = m.tenant"
        " AND d.session = m.session), 0)", (tenant, OBSERVATIONS_ROLE)).fetchall()
    return [(str(t), str(s)) for t, s in rows]


def save(conn: Connection, *, tenant: str, project: str, session: str, text: str,
         sources: list[SourceMessage], generation: int, method: str,
         input_tokens: int | None = None, archive: list[int] | None = None) -> int | None:
    """Store one distillation and its observations message; its id.

    Returns None when the log is not smaller than its input: an expansion is no
    distillation, so it gets no observations message (search, ``lore data show``
    and the prompt never see it). Its row still records the progress mark
    (``last_source``, so the segment is not retried forever) and the log, archived,
    for the curator: a short segment can still hold a decision worth keeping.
    """
    now = time.time()
    ids = [m.id for m in sources]
    n_in = input_tokens if input_tokens is not None else sum(
        fmt.estimate_tokens(m.content) for m in sources)
    n_out = fmt.estimate_tokens(text)
    last = max(ids) if ids else 0
    keep = bool(text.strip()) and n_out < n_in
    with conn:
        message_id: int | None = None
        if keep:
            turn_id = conn.insert(
                "INSERT INTO turns(tenant, project, session, protocol, model, created_at,"
                " complete) VALUES (?,?,?,?,?,?,1)",
                (tenant, project, session, DISTILL_PROTOCOL, method, now))
            body = f"{text}\nSources: {fmt.source_refs(ids)}" if ids else text
            message_id = conn.insert(
                "INSERT INTO messages(turn_id, tenant, project, session, seq, role, content,"
                " tokens, created_at, meta) VALUES (?,?,?,?,0,?,?,?,?,?)",
                (turn_id, tenant, project, session, OBSERVATIONS_ROLE, body, n_out, now,
                 orjson.dumps({"distillation_sources": ids, "generation": generation}).decode()))
        row_id = conn.insert(
            "INSERT INTO distillations(tenant, project, session, generation, message_id, text,"
            " source_ids, last_source, input_tokens, output_tokens, method, created_at,"
            " archived) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (tenant, project, session, generation, message_id, text,
             orjson.dumps(ids).decode(), last, n_in, n_out, method, now, 0 if keep else 1))
        for old in archive or []:
            conn.execute("UPDATE distillations SET archived = 1 WHERE id = ?", (old,))
    return row_id if keep else None


def distill_extractive(conn: Connection, tenant: str, session: str,
                       max_tokens: int = MAX_SEGMENT_TOKENS,
                       consolidate_after: int | None = None, *,
                       whole_segments: bool = False) -> list[int]:
    """Distill a session's undistilled segments without a model; new row ids.

    As the worker does: after each log, the first-level logs are merged once there
    are more than ``consolidate_after`` of them. ``whole_segments``: only while a
    full segment of ``max_tokens`` is waiting (the worker's token trigger), so the
    newest messages stay undistilled; otherwise everything (the idle trigger).
    """
    project = project_of(conn, tenant, session)
    made: list[int] = []
    while project is not None:
        if whole_segments and undistilled_tokens(conn, tenant, session) < max_tokens:
            break
        segment = next_segment(conn, tenant, session, max_tokens)
        if not segment:
            break
        text = extractive.distill(segment)
        row = save(conn, tenant=tenant, project=project, session=session, text=text,
                   sources=segment, generation=0, method="extractive")
        if row is None:
            continue
        made.append(row)
        if consolidate_after is not None:
            merged = consolidate_extractive(conn, tenant, session, consolidate_after)
            if merged is not None:
                made.append(merged)
    return made


def active(conn: Connection, tenant: str, session: str,
           generation: int | None = None) -> list[Distillation]:
    rows = conn.execute(
        "SELECT * FROM distillations WHERE tenant = ? AND session = ? AND archived = 0"
        " AND (?3 IS NULL OR generation = ?3) ORDER BY id", (tenant, session, generation))
    return [_row(r) for r in rows.fetchall()]


def for_scope(conn: Connection, tenant: str | None, *, session: str | None = None,
              project: str | None = None, include_archived: bool = False) -> list[Distillation]:
    rows = conn.execute(
        "SELECT * FROM distillations WHERE (?1 IS NULL OR tenant = ?1)"
        " AND (?2 IS NULL OR session = ?2) AND (?3 IS NULL OR project = ?3)"
        " AND (?4 = 1 OR (archived = 0 AND text != '')) ORDER BY id",
        (tenant, session, project, int(include_archived)))
    return [_row(r) for r in rows.fetchall()]


def uncurated(conn: Connection, tenant: str, project: str) -> list[Distillation]:
    rows = conn.execute(
        "SELECT * FROM distillations WHERE tenant = ? AND project = ? AND curated = 0"
        " AND text != '' ORDER BY id", (tenant, project))
    return [_row(r) for r in rows.fetchall()]


def mark_curated(conn: Connection, ids: list[int]) -> None:
    with conn:
        for row_id in ids:
            conn.execute("UPDATE distillations SET curated = 1 WHERE id = ?", (row_id,))


def consolidate_extractive(conn: Connection, tenant: str, session: str,
                           threshold: int) -> int | None:
    """Merge a session's generation-0 logs into one generation-1 log once there
    are more than ``threshold`` of them; the new row id."""
    gen0 = active(conn, tenant, session, 0)
    if len(gen0) <= threshold:
        return None
    text = fmt.merge([d.text for d in gen0], sum(d.input_tokens for d in gen0))
    sources = [SourceMessage(i, "", "", 0.0) for d in gen0 for i in d.source_ids]
    return save(conn, tenant=tenant, project=gen0[-1].project, session=session, text=text,
                sources=sources, generation=1, method="extractive",
                input_tokens=sum(d.output_tokens for d in gen0) + 1,
                archive=[d.id for d in gen0])


def _row(row: Any) -> Distillation:
    (rid, tenant, project, session, generation, _message_id, text, source_ids, _last,
     n_in, n_out, method, created_at, archived, _curated) = row
    return Distillation(int(rid), str(tenant), str(project), str(session),
                        int(generation), str(text), list(orjson.loads(str(source_ids))),
                        int(n_in), int(n_out), str(method), float(created_at),
                        bool(archived))


def forget(conn: Connection, tenant: str | None, *, session: str | None = None,
           project: str | None = None) -> None:
    """Delete what was derived from a session's or project's turns (``lore data
    delete``): its distillations, frozen knowledge blocks and queued jobs, and for
    a project its own knowledge entries and their history (cross-project ones stay
    with the user)."""
    column, value = ("session", session) if session is not None else ("project", project)
    with conn:
        # Context state (context/store.py) holds a rendered prefix: it goes too.
        conn.execute("DELETE FROM context_sessions WHERE (?2 IS NULL OR tenant = ?2) AND"
                     " (session = ?1 OR session IN (SELECT session FROM distillations WHERE"
                     " project = ?3 UNION SELECT session FROM knowledge_sessions WHERE"
                     " project = ?3))", (session, tenant, project))
        for table in ("distillations", "knowledge_sessions", "worker_jobs"):
            conn.execute(f"DELETE FROM {table} WHERE {column} = ? AND (?2 IS NULL OR"
                         " tenant = ?2)", (value, tenant))
        if project is not None:
            conn.execute("DELETE FROM knowledge WHERE project = ? AND cross_project = 0 AND"
                         " (?2 IS NULL OR tenant = ?2)", (project, tenant))
            history.forget_project(conn, tenant, project)
