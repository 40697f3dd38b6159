"""The writer's batches on Postgres: whole runs of turns in a handful of statements.

On SQLite a turn costs a few in-process calls; on Postgres each statement is a
round trip, and a turn written statement by statement (savepoint, supersede check,
turn, each message, session, release) made ingest ten times slower than SQLite.
Here a run of ordinary turns is written set-wise: one query reserves the ids, one
``INSERT … SELECT FROM unnest`` each writes the turns and the messages (the search
index is filled by the statement-level trigger of schema v11, set-wise too), one
upsert the sessions. What is stored is exactly what ``writer.write_prepared`` stores
turn by turn: the same rows, ids ascending in submission order.

A turn that needs the careful path (an import's ``dedup_key``; input that may
supersede an incomplete attempt of its session) is written by ``write_one`` in its
own savepoint, in order between the runs. A run that fails as a whole is rolled
back to its savepoint and written turn by turn, so one bad turn still costs only
itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lore_gateway.memory.errors import StorageUnavailable
from lore_gateway.memory.records import TurnRecord
from lore_gateway.memory.writer import (
    PreparedTurn,
    estimate_tokens,
    meta_json,
    prepare_turn,
)
from lore_gateway.storage.base import Connection

WriteOne = Callable[[Connection, TurnRecord], "list[int] | object | None"]


def write_turns(conn: Connection, turns: Sequence[TurnRecord], max_message_bytes: int,
                write_one: WriteOne) -> list[list[int] | object | None]:
    """Write ``turns`` in order inside the open transaction; per turn its message
    ids, None (nothing to write) or ``write_one``'s result."""
    prepared = [prepare_turn(turn, max_message_bytes) for turn in turns]
    incomplete = _incomplete_sessions(conn, [p.turn for p in prepared if p is not None
                                             and p.inputs])
    results: list[list[int] | object | None] = [None] * len(turns)
    run: list[int] = []  # indexes of the current set-wise run

    def flush() -> None:
        if run:
            for i, ids in zip(run, _write_run(conn, [turns[i] for i in run],
                                              [prepared[i] for i in run], write_one),
                              strict=True):
                results[i] = ids
            run.clear()

    for i, p in enumerate(prepared):
        if p is None:
            continue
        key = (p.turn.identity.tenant, p.turn.identity.session)
        if p.turn.dedup_key is not None or (p.inputs and key in incomplete):
            flush()
            results[i] = write_one(conn, turns[i])
        else:
            run.append(i)
        if not p.turn.complete:
            incomplete.add(key)
    flush()
    return results


def _incomplete_sessions(conn: Connection, turns: list[TurnRecord]) -> set[tuple[str, str]]:
    """(tenant, session) of these turns' sessions that have a stored incomplete turn."""
    if not turns:
        return set()
    keys = sorted({(t.identity.tenant, t.identity.session) for t in turns})
    return {(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT DISTINCT tenant, session FROM turns WHERE complete = 0 AND (tenant, session)"
        " IN (SELECT * FROM unnest(?::text[], ?::text[]))",
        ([k[0] for k in keys], [k[1] for k in keys]))}


def _write_run(conn: Connection, turns: list[TurnRecord], prepared: list[PreparedTurn | None],
               write_one: WriteOne) -> list[list[int] | object | None]:
    """A run in one savepoint; if it fails, each turn again in its own."""
    ready = [p for p in prepared if p is not None]
    try:
        with conn:
            return list(_insert_run(conn, ready))
    except StorageUnavailable:
        raise
    except Exception:
        return [write_one(conn, turn) for turn in turns]


def _insert_run(conn: Connection, run: list[PreparedTurn]) -> list[list[int]]:
    messages = sum(len(p.rows) for p in run)
    row = conn.execute(
        "SELECT array(SELECT nextval(pg_get_serial_sequence('turns', 'id'))"
        " FROM generate_series(1, ?)),"
        " array(SELECT nextval(pg_get_serial_sequence('messages', 'id'))"
        " FROM generate_series(1, ?))", (len(run), messages)).fetchone()
    assert row is not None
    turn_ids, message_ids = sorted(row[0]), sorted(row[1])
    conn.execute(
        "INSERT INTO turns(id, tenant, project, session, protocol, model, created_at, complete,"
        " dedup_key) SELECT * FROM unnest(?::bigint[], ?::text[], ?::text[], ?::text[],"
        " ?::text[], ?::text[], ?::double precision[], ?::integer[], ?::text[])",
        (turn_ids, *_columns([(p.turn.identity.tenant, p.turn.identity.project,
                               p.turn.identity.session, p.turn.protocol, p.turn.model,
                               p.turn.created_at, int(p.turn.complete), p.turn.dedup_key)
                              for p in run], 8)))
    rows = []
    out: list[list[int]] = []
    ids = iter(message_ids)
    for turn_id, p in zip(turn_ids, run, strict=True):
        ident, mine = p.turn.identity, []
        for seq, (role, content, truncated, meta) in enumerate(p.rows):
            mid = next(ids)
            mine.append(mid)
            rows.append((mid, turn_id, ident.tenant, ident.project, ident.session, seq, role,
                         content, estimate_tokens(content), p.turn.created_at, int(truncated),
                         meta_json(meta)))
        out.append(mine)
    conn.execute(
        "INSERT INTO messages(id, turn_id, tenant, project, session, seq, role, content,"
        " tokens, created_at, truncated, meta) SELECT * FROM unnest(?::bigint[], ?::bigint[],"
        " ?::text[], ?::text[], ?::text[], ?::integer[], ?::text[], ?::text[], ?::integer[],"
        " ?::double precision[], ?::integer[], ?::text[])", _columns(rows, 12))
    # (project, first_seen, last_seen, turns): the last turn's project, as
    # turn-by-turn upserts leave it.
    sessions: dict[tuple[str, str], tuple[str, float, float, int]] = {}
    for p in run:
        ident, at = p.turn.identity, p.turn.created_at
        key = (ident.tenant, ident.session)
        found = sessions.get(key)
        sessions[key] = (ident.project, at, at, 1) if found is None else \
            (ident.project, min(found[1], at), max(found[2], at), found[3] + 1)
    conn.execute(
        "INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)"
        " SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::double precision[],"
        " ?::double precision[], ?::integer[]) ON CONFLICT(tenant, id) DO UPDATE SET"
        " project = excluded.project,"
        " first_seen = CASE WHEN excluded.first_seen < sessions.first_seen"
        " THEN excluded.first_seen ELSE sessions.first_seen END,"
        " last_seen = CASE WHEN excluded.last_seen > sessions.last_seen"
        " THEN excluded.last_seen ELSE sessions.last_seen END,"
        " turns = sessions.turns + excluded.turns",
        _columns([(t, s, *v) for (t, s), v in sessions.items()], 6))
    return out


def _columns(rows: Sequence[tuple[object, ...]], width: int) -> list[list[object]]:
    """Rows as ``width`` column lists (the arrays ``unnest`` turns back into rows)."""
    return [[r[c] for r in rows] for c in range(width)] if rows else [[] for _ in range(width)]
