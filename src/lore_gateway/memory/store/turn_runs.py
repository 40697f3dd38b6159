"""Which turns of a batch the writer may write set-wise, and their rows (both backends).

Most turns are ordinary: no import key, and no incomplete attempt of their
session that their input could supersede. A run of them is written with a few
statements for the whole run (each backend spells them: ``writer_pg``,
``writer_sqlite``), which stores exactly the rows ``turn_rows.write_prepared`` stores
turn by turn: the same rows, ids ascending in submission order, each session's
counts and bounds. A turn that needs the careful path (an import's
``dedup_key``; input that may supersede an incomplete attempt) is written on its
own by the backend's ``write_one``, in order between the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from lore_gateway.memory.store.records import TurnRecord
from lore_gateway.memory.store.turn_rows import (
    SESSION_PROJECT,
    PreparedTurn,
    estimate_tokens,
    meta_json,
    prepare_turn,
)
from lore_gateway.memory.tenancy.identity import UNKNOWN_PROJECT
from lore_gateway.storage.base import Connection

WriteOne = Callable[[Connection, TurnRecord], "list[int] | object | None"]
SessionKey = tuple[str, str]


class Backend(Protocol):
    """A backend's spelling of the two statements that differ."""

    def incomplete_sessions(self, conn: Connection, keys: list[SessionKey]) -> set[SessionKey]:
        """Those of ``keys`` (tenant, session) that have a stored incomplete turn."""
        ...

    def write_run(self, conn: Connection, turns: list[TurnRecord],
                  prepared: list[PreparedTurn], write_one: WriteOne
                  ) -> list[list[int] | object | None]:
        """A run of ordinary turns; per turn its message ids (or ``write_one``'s
        result, should the backend fall back to it)."""
        ...


def write_turns(conn: Connection, turns: Sequence[TurnRecord], max_message_bytes: int,
                write_one: WriteOne, backend: Backend) -> list[list[int] | object | None]:
    """Write ``turns`` in order inside the open transaction; per turn its message
    ids, None (nothing to write) or ``write_one``'s result."""
    prepared = [prepare_turn(turn, max_message_bytes) for turn in turns]
    keys = sorted({_key(p.turn) for p in prepared if p is not None and p.inputs})
    incomplete = backend.incomplete_sessions(conn, keys) if keys else set()
    results: list[list[int] | object | None] = [None] * len(turns)
    run: list[int] = []  # indexes of the current set-wise run

    def flush() -> None:
        if run:
            ready = [prepared[i] for i in run]
            for i, ids in zip(run, backend.write_run(conn, [turns[i] for i in run],
                                                     [p for p in ready if p is not None],
                                                     write_one), strict=True):
                results[i] = ids
            run.clear()

    for i, p in enumerate(prepared):
        if p is None:
            continue
        key = _key(p.turn)
        if p.turn.dedup_key is not None or (p.inputs and key in incomplete):
            flush()
            results[i] = write_one(conn, turns[i])
        else:
            run.append(i)
        if not p.turn.complete:
            incomplete.add(key)
    flush()
    return results


def _key(turn: TurnRecord) -> SessionKey:
    return (turn.identity.tenant, turn.identity.session)


def turn_rows(run: list[PreparedTurn], turn_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """(id, tenant, project, session, protocol, model, created_at, complete, dedup_key)."""
    return [(tid, p.turn.identity.tenant, p.turn.identity.project, p.turn.identity.session,
             p.turn.protocol, p.turn.model, p.turn.created_at, int(p.turn.complete),
             p.turn.dedup_key) for tid, p in zip(turn_ids, run, strict=True)]


def message_rows(run: list[PreparedTurn], turn_ids: Sequence[int], message_ids: Sequence[int]
                 ) -> tuple[list[tuple[Any, ...]], list[list[int]]]:
    """The run's message rows (id, turn_id, tenant, project, session, seq, role,
    content, tokens, created_at, truncated, meta) and each turn's message ids."""
    rows: list[tuple[Any, ...]] = []
    out: list[list[int]] = []
    ids = iter(message_ids)
    for turn_id, p in zip(turn_ids, run, strict=True):
        ident, at, mine = p.turn.identity, p.turn.created_at, []
        for seq, (role, content, truncated, meta) in enumerate(p.rows):
            mid = next(ids)
            mine.append(mid)
            rows.append((mid, turn_id, ident.tenant, ident.project, ident.session, seq, role,
                         content, estimate_tokens(content), at, int(truncated),
                         meta_json(meta)))
        out.append(mine)
    return rows, out


def session_rows(run: list[PreparedTurn]) -> list[tuple[Any, ...]]:
    """(tenant, id, project, first_seen, last_seen, turns) per session of the run,
    for one upsert that adds ``turns``: the last known project, as turn-by-turn
    upserts leave it."""
    sessions: dict[SessionKey, tuple[str, float, float, int]] = {}
    for p in run:
        ident, at = p.turn.identity, p.turn.created_at
        key = (ident.tenant, ident.session)
        found = sessions.get(key)
        if found is None:
            sessions[key] = (ident.project, at, at, 1)
            continue
        project = found[0] if ident.project == UNKNOWN_PROJECT else ident.project
        sessions[key] = (project, min(found[1], at), max(found[2], at), found[3] + 1)
    return [(t, s, *v) for (t, s), v in sessions.items()]


# The upsert's conflict clause, the same on both backends.
SESSION_UPSERT = (
    " ON CONFLICT(tenant, id) DO UPDATE SET"
    + SESSION_PROJECT +
    " first_seen = CASE WHEN excluded.first_seen < sessions.first_seen"
    " THEN excluded.first_seen ELSE sessions.first_seen END,"
    " last_seen = CASE WHEN excluded.last_seen > sessions.last_seen"
    " THEN excluded.last_seen ELSE sessions.last_seen END,"
    " turns = sessions.turns + excluded.turns")
