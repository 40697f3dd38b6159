"""The writer's batches on SQLite: a run of turns in a few multi-row statements.

Each message's row fires the FTS5 trigger, which tokenizes it into
``messages_fts`` and ``context_fts``. FTS5 keeps those index rows in memory until
the transaction commits, unless a savepoint comes first; and SQLite opens a
statement savepoint, on every virtual table the transaction wrote, at the start
of each statement that may write several rows and may abort (an ``INSERT`` with a
trigger, ``RETURNING``, or several rows, into a table with constraints). So
written statement by statement (turn ``RETURNING id``, each message, the session),
every message's index rows were flushed to the file as a segment of their own,
two per message, and the commit then merged those tiny segments: at c=16 about
half of a turn's SQLite time (docs/benchmarks.md, "lore-store: CPU per stored
turn").

Here a run of ordinary turns (``turn_runs``) takes one statement per table: the
ids are reserved (``max(id)`` + 1 onwards, which is what SQLite would assign
itself, while the write lock is held), then one multi-row ``INSERT`` each writes
the turns and the sessions, and the messages come last, so their index rows
build up in memory and reach the file once, at the commit. Runs fail whole: the
writer then rolls the batch back and writes it turn by turn, each in a savepoint.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

from lore_gateway.memory.store import turn_runs
from lore_gateway.memory.store.records import TurnRecord
from lore_gateway.memory.store.turn_rows import PreparedTurn
from lore_gateway.memory.store.turn_runs import SessionKey, WriteOne
from lore_gateway.storage.base import Connection

# Rows per multi-row statement, and the statement sizes are powers of two up to
# it: few distinct statement texts, so the connection's prepared-statement cache
# (apsw keeps 100) holds them all, and at most 64 x 12 bound values (SQLite
# allows 32,766). Each statement still flushes the index rows before it, so a
# run of 256 two-message turns makes 8 segments per index instead of 512.
MAX_ROWS = 64


def write_turns(conn: Connection, turns: Sequence[TurnRecord], max_message_bytes: int,
                write_one: WriteOne) -> list[list[int] | object | None]:
    """Write ``turns`` in order inside the open transaction (``turn_runs.write_turns``)."""
    return turn_runs.write_turns(conn, turns, max_message_bytes, write_one, _SQLITE)


class _Sqlite:
    def incomplete_sessions(self, conn: Connection, keys: list[SessionKey]) -> set[SessionKey]:
        """One lookup per session in the partial index of incomplete turns."""
        return {key for key in keys if conn.execute(
            "SELECT 1 FROM turns WHERE tenant = ? AND session = ? AND complete = 0 LIMIT 1",
            key).fetchone() is not None}

    def write_run(self, conn: Connection, turns: list[TurnRecord],
                  prepared: list[PreparedTurn], write_one: WriteOne
                  ) -> list[list[int] | object | None]:
        """No savepoint of its own: one would flush the index rows too. A failure
        reaches the writer, which writes the batch again turn by turn."""
        return list(_insert_run(conn, prepared))


_SQLITE = _Sqlite()


def _insert_run(conn: Connection, run: list[PreparedTurn]) -> list[list[int]]:
    row = conn.execute("SELECT (SELECT coalesce(max(id), 0) FROM turns),"
                       " (SELECT coalesce(max(id), 0) FROM messages)").fetchone()
    assert row is not None
    last_turn, last_message = int(row[0]), int(row[1])
    turn_ids = range(last_turn + 1, last_turn + 1 + len(run))
    messages = sum(len(p.rows) for p in run)
    rows, out = turn_runs.message_rows(
        run, turn_ids, range(last_message + 1, last_message + 1 + messages))
    _insert(conn, "INSERT INTO turns(id, tenant, project, session, protocol, model,"
                  " created_at, complete, dedup_key)", turn_runs.turn_rows(run, turn_ids), 9)
    _insert(conn, "INSERT INTO sessions(tenant, id, project, first_seen, last_seen, turns)",
            turn_runs.session_rows(run), 6, turn_runs.SESSION_UPSERT)
    _insert(conn, "INSERT INTO messages(id, turn_id, tenant, project, session, seq, role,"
                  " content, tokens, created_at, truncated, meta)", rows, 12)
    return out


def _insert(conn: Connection, head: str, rows: list[tuple[Any, ...]], width: int,
            tail: str = "") -> None:
    for chunk in _chunks(rows):
        conn.execute(_statement(head, width, len(chunk), tail),
                     [value for r in chunk for value in r])


def _chunks(rows: list[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    """``rows`` in slices of ``MAX_ROWS``, then of the powers of two below it."""
    start = 0
    while start < len(rows):
        size = min(MAX_ROWS, 1 << ((len(rows) - start).bit_length() - 1))
        yield rows[start:start + size]
        start += size


@lru_cache(maxsize=64)
def _statement(head: str, width: int, count: int, tail: str) -> str:
    row = "(" + ",".join("?" * width) + ")"
    return f"{head} VALUES {','.join([row] * count)}{tail}"
