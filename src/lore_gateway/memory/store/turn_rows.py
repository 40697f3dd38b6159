"""One turn's rows: the turn made storable, cleaned, and written with its
session (the careful path every backend shares).

The writer thread (``writer.py``) decides when and in which commit turns are
written; ``turn_runs`` writes a run of ordinary turns set-wise with exactly the
rows :func:`write_prepared` stores one turn at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.sanitize import clean_for_storage, storable
from lore_gateway.memory.tenancy.identity import UNKNOWN_PROJECT
from lore_gateway.privacy import redact_turn
from lore_gateway.storage.base import Connection, Cursor

# Token estimate: about three characters per token for mixed prose and code
# (the reference gateway's rule, lore-spec A.5). Cheap, and close enough to budget by.
CHARS_PER_TOKEN = 3
# The roles of a turn's client-side input; the assistant's output is everything else.
INPUT_ROLES = ("user", "tool")


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _storable_meta(value: Any) -> Any:
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(str(k)): _storable_meta(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_meta(v) for v in value]
    return value


def storable_turn(turn: TurnRecord) -> TurnRecord:
    """The turn with every string made storable (``sanitize.storable``): the one
    place where client text is fixed up for SQLite, applied on the writer thread."""
    ident = turn.identity
    return TurnRecord(
        identity=Identity(storable(ident.tenant), storable(ident.project),
                          storable(ident.session)),
        protocol=storable(turn.protocol),
        model=storable(turn.model) if turn.model is not None else None,
        messages=tuple(type(m)(role=m.role, text=storable(m.text)) for m in turn.messages),
        created_at=turn.created_at,
        complete=turn.complete,
        dedup_key=storable(turn.dedup_key) if turn.dedup_key is not None else None,
        metas=(tuple(_storable_meta(m) for m in turn.metas)
               if turn.metas is not None else None),
    )


def prepare_turn(turn: TurnRecord, max_message_bytes: int) -> PreparedTurn | None:
    """The turn made storable with its non-empty messages cleaned for storage
    (role, content, truncated, meta); None when every message is empty.

    Private spans are redacted again here (``privacy.redact_turn``; a live turn
    was already redacted where it was made, so this finds nothing there): an
    imported transcript or any other writer of turns gets the same rule."""
    turn = storable_turn(turn)
    metas = turn.metas if turn.metas is not None else (None,) * len(turn.messages)
    rows: list[tuple[str, str, bool, dict[str, Any] | None]] = []
    for message, meta in zip(redact_turn(turn.messages), metas, strict=True):
        content, truncated = clean_for_storage(message.text, max_message_bytes)
        if content.strip():
            rows.append((message.role, content, truncated, meta))
    return PreparedTurn(turn, rows) if rows else None


@dataclass(slots=True)
class PreparedTurn:
    turn: TurnRecord
    rows: list[tuple[str, str, bool, dict[str, Any] | None]]

    @property
    def inputs(self) -> list[str]:
        """The client-side input texts (what a retry of the same request repeats)."""
        return [content for role, content, _, _ in self.rows if role in INPUT_ROLES]


def meta_json(meta: dict[str, Any] | None) -> str | None:
    return orjson.dumps(meta).decode() if meta is not None else None


# A session's project, once known, is kept when a turn of it names none: a
# client's helper calls (a title, a classifier) share the session's id but not
# its system prompt, where the working directory is read from.
SESSION_PROJECT = (
    f" project = CASE WHEN excluded.project = '{UNKNOWN_PROJECT}'"
    " THEN sessions.project ELSE excluded.project END,"
)


def write_turn(conn: Connection, turn: TurnRecord, max_message_bytes: int) -> list[int] | None:
    """Insert one turn; the new message ids, or ``None`` when nothing was written.

    Nothing is written when every message is empty after cleaning, or when the
    turn's ``dedup_key`` is already stored (an import seen before).
    """
    prepared = prepare_turn(turn, max_message_bytes)
    return None if prepared is None else write_prepared(conn, prepared)


def write_prepared(conn: Connection, prepared: PreparedTurn) -> list[int] | None:
    """``write_turn`` after ``prepare_turn``."""
    turn, rows = prepared.turn, prepared.rows
    ident = turn.identity
    if turn.dedup_key is not None and not _claim_dedup_key(conn, turn.dedup_key):
        return None
    _supersede_incomplete(conn, turn, prepared.inputs)
    turn_id = _insert_turn(conn, turn)
    ids: list[int] = []
    for seq, (role, content, truncated, meta) in enumerate(rows):
        ids.append(conn.insert(
            "INSERT INTO messages(turn_id, tenant, project, session, seq, role, content, tokens,"
            " created_at, truncated, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (turn_id, ident.tenant, ident.project, ident.session, seq, role, content,
             estimate_tokens(content), turn.created_at, int(truncated),
             meta_json(meta)),
        ))
    conn.execute(
        "INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)"
        " VALUES (?,?,?,?,?,1) ON CONFLICT(tenant, id) DO UPDATE SET"
        + SESSION_PROJECT +
        " first_seen = CASE WHEN excluded.first_seen < sessions.first_seen"
        " THEN excluded.first_seen ELSE sessions.first_seen END,"
        " last_seen = CASE WHEN excluded.last_seen > sessions.last_seen"
        " THEN excluded.last_seen ELSE sessions.last_seen END,"
        " turns = sessions.turns + 1",
        (ident.tenant, ident.session, ident.project, turn.created_at, turn.created_at),
    )
    return ids


def _insert_turn(conn: Connection, turn: TurnRecord) -> int:
    ident = turn.identity
    return conn.insert(
        "INSERT INTO turns(tenant, project, session, protocol, model, created_at, complete,"
        " dedup_key) VALUES (?,?,?,?,?,?,?,?)",
        (ident.tenant, ident.project, ident.session, turn.protocol, turn.model,
         turn.created_at, int(turn.complete), turn.dedup_key),
    )


def _claim_dedup_key(conn: Connection, key: str) -> bool:
    """``False`` if this exact key is stored; else drop older versions of it."""
    if conn.execute("SELECT 1 FROM turns WHERE dedup_key = ?", (key,)).fetchone() is not None:
        return False
    stable, sep, _version = key.partition("#")
    if sep:
        # '$' sorts right after '#': the range is every "<stable>#..." key.
        for old_id in _int_column(conn.execute(
            "SELECT id FROM turns WHERE dedup_key > ? AND dedup_key < ?",
            (stable + "#", stable + "$"),
        )):
            _delete_turn(conn, old_id)
    return True


def _supersede_incomplete(conn: Connection, turn: TurnRecord, user_texts: list[str]) -> None:
    """Drop earlier incomplete attempts of this session that carried the same input
    (the user's words, or the tool results of a tool-loop step).

    Clients retry a failed request with the same new input (Codex up to
    ``stream_max_retries`` times); the retry's turn replaces the partial one so the
    user's words are stored once.
    """
    if not user_texts:
        return
    ident = turn.identity
    for old_id in _int_column(conn.execute(
        "SELECT id FROM turns WHERE tenant = ? AND session = ? AND complete = 0",
        (ident.tenant, ident.session),
    )):
        old_texts = [
            row[0]
            for row in conn.execute(
                "SELECT content FROM messages WHERE turn_id = ? AND role IN ('user', 'tool')"
                " ORDER BY seq",
                (old_id,),
            )
        ]
        if old_texts == user_texts:
            _delete_turn(conn, old_id)


def _delete_turn(conn: Connection, turn_id: int) -> None:
    row = conn.execute("SELECT tenant, session FROM turns WHERE id = ?", (turn_id,)).fetchone()
    if row is None:
        return
    conn.execute("DELETE FROM turns WHERE id = ?", (turn_id,))
    conn.execute(
        "UPDATE sessions SET turns = turns - 1 WHERE tenant = ? AND id = ?", (row[0], row[1])
    )


def _int_column(cursor: Cursor) -> list[int]:
    return [row[0] for row in cursor.fetchall() if isinstance(row[0], int)]
