"""The writer's batches on Postgres: whole runs of turns in a handful of statements.

On SQLite a turn costs a few in-process calls; on Postgres each statement is a
round trip, and a turn written statement by statement (savepoint, supersede check,
turn, each message, session, release) made ingest ten times slower than SQLite.
Here a run of ordinary turns (``turn_runs``) is written set-wise: one query
reserves the ids, one ``INSERT … SELECT FROM unnest`` each writes the turns and
the messages (the search index is filled by the statement-level trigger of schema
v11, set-wise too), one upsert the sessions.

A run that fails as a whole is rolled back to its savepoint and written turn by
turn, so one bad turn still costs only itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from lore_gateway.memory.store import turn_runs
from lore_gateway.memory.store.records import TurnRecord
from lore_gateway.memory.store.turn_rows import PreparedTurn
from lore_gateway.memory.store.turn_runs import SessionKey, WriteOne
from lore_gateway.storage.base import Connection
from lore_gateway.storage.errors import StorageUnavailable


def write_turns(conn: Connection, turns: Sequence[TurnRecord], max_message_bytes: int,
                write_one: WriteOne) -> list[list[int] | object | None]:
    """Write ``turns`` in order inside the open transaction (``turn_runs.write_turns``)."""
    return turn_runs.write_turns(conn, turns, max_message_bytes, write_one, _POSTGRES)


class _Postgres:
    def incomplete_sessions(self, conn: Connection, keys: list[SessionKey]) -> set[SessionKey]:
        return {(str(r[0]), str(r[1])) for r in conn.execute(
            "SELECT DISTINCT tenant, session FROM turns WHERE complete = 0 AND (tenant, session)"
            " IN (SELECT * FROM unnest(?::text[], ?::text[]))",
            ([k[0] for k in keys], [k[1] for k in keys]))}

    def write_run(self, conn: Connection, turns: list[TurnRecord],
                  prepared: list[PreparedTurn], write_one: WriteOne
                  ) -> list[list[int] | object | None]:
        """A run in one savepoint; if it fails, each turn again in its own."""
        try:
            with conn:
                return list(_insert_run(conn, prepared))
        except StorageUnavailable:
            raise
        except Exception:
            return [write_one(conn, turn) for turn in turns]


_POSTGRES = _Postgres()


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
        _columns(turn_runs.turn_rows(run, turn_ids), 9))
    rows, out = turn_runs.message_rows(run, turn_ids, message_ids)
    conn.execute(
        "INSERT INTO messages(id, turn_id, tenant, project, session, seq, role, content,"
        " tokens, created_at, truncated, meta) SELECT * FROM unnest(?::bigint[], ?::bigint[],"
        " ?::text[], ?::text[], ?::text[], ?::integer[], ?::text[], ?::text[], ?::integer[],"
        " ?::double precision[], ?::integer[], ?::text[])", _columns(rows, 12))
    conn.execute(
        "INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)"
        " SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::double precision[],"
        " ?::double precision[], ?::integer[])" + turn_runs.SESSION_UPSERT,
        _columns(turn_runs.session_rows(run), 6))
    return out


def _columns(rows: Sequence[tuple[object, ...]], width: int) -> list[list[object]]:
    """Rows as ``width`` column lists (the arrays ``unnest`` turns back into rows)."""
    return [[r[c] for r in rows] for c in range(width)] if rows else [[] for _ in range(width)]
