"""One batch of the writer thread: raw turns parsed, then whole turns in one
commit.

``TurnWriter`` (``writer.py``) owns the queue, the thread and its counters;
this module does the database side of one batch and reports what it did, so
the thread's supervision and the commit's rules can be read apart. Each backend
writes runs of ordinary turns set-wise (``writer_sqlite``, ``writer_pg``); a
turn that fails costs only itself (:func:`write_one`, in its own savepoint).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lore_gateway.memory.store.records import RawTurn, TurnRecord
from lore_gateway.memory.store.sanitize import storable
from lore_gateway.memory.store.turn_rows import write_turn
from lore_gateway.memory.store.turn_runs import WriteOne
from lore_gateway.storage.base import Connection
from lore_gateway.storage.errors import StorageBusy, StorageError, StorageUnavailable

log = logging.getLogger(__name__)

# Attempts at the write lock before a batch fails. Each waits up to the busy
# timeout; only another process (the embedder, a CLI) can hold the lock.
BEGIN_ATTEMPTS = 3
# A turn that could not be written (:func:`write_one`).
FAILED = object()


@dataclass(frozen=True, slots=True)
class Resolved:
    """A batch with its raw turns parsed: the items to write, and how many raw
    turns failed to parse or held no message at all (both done already)."""

    items: list[object]
    failed: int = 0
    skipped: int = 0


def resolve(batch: list[object]) -> Resolved:
    """Raw turns parsed into turns (outside the write lock); one with no
    message at all is skipped, as ``PendingTurn`` skips an empty turn."""
    if not any(isinstance(item, RawTurn) for item in batch):
        return Resolved(batch)
    from lore_gateway.collector import resolve_turn

    out: list[object] = []
    failed = skipped = 0
    for item in batch:
        if isinstance(item, RawTurn):
            try:
                resolved = resolve_turn(item)
            except Exception as exc:
                log.error("memory: could not read a turn's output of session %s (%s); "
                          "skipped", storable(item.turn.identity.session[:16]), brief(exc))
                failed += 1
                continue
            if resolved is None:
                skipped += 1
                continue
            item = resolved
        out.append(item)
    return Resolved(out, failed, skipped)


@dataclass(frozen=True, slots=True)
class Committed:
    """What one commit of a batch did: turns written, skipped (nothing to
    write) and failed, and the new message ids (empty unless committed)."""

    written: int
    skipped: int
    failed: int
    message_ids: list[int]
    committed: bool


def commit_batch(conn: Connection, turns: list[TurnRecord],
                 max_message_bytes: int) -> Committed:
    """One commit of whole turns. Raises ``StorageUnavailable`` (nothing
    committed, rolled back) when the database cannot be reached; any other
    storage error rolls the batch back and counts every turn as failed."""
    written = skipped = failed = 0
    message_ids: list[int] = []
    try:
        begin_immediate(conn)
        if conn.backend == "postgres":
            from lore_gateway.storage.writer_pg import write_turns

            results = write_turns(conn, turns, max_message_bytes, _write_one(max_message_bytes))
        else:
            results = _write_sqlite(conn, turns, max_message_bytes)
        for ids in results:
            if ids is FAILED:
                failed += 1
            elif ids is None:
                skipped += 1
            else:
                assert isinstance(ids, list)
                written += 1
                message_ids.extend(ids)
        conn.commit()
    except StorageUnavailable:
        if conn.in_transaction:
            conn.rollback()
        raise
    except StorageError as exc:
        log.error("memory: a commit of %d turns failed (%s); they are not stored",
                  len(turns), brief(exc))
        if conn.in_transaction:
            conn.rollback()
        return Committed(written, skipped, failed + len(turns), [], committed=False)
    return Committed(written, skipped, failed, message_ids, committed=True)


def _write_sqlite(conn: Connection, turns: list[TurnRecord], max_message_bytes: int
                  ) -> list[list[int] | object | None]:
    """The batch's turns in order (runs of them set-wise: ``writer_sqlite``),
    first without a savepoint each: a savepoint makes FTS5 write out its
    pending index rows as a segment of their own, one per turn in both
    indexes, where one commit can write one. Should any turn fail, the batch
    starts over with a savepoint per turn, so that only that turn is lost
    (rare: a turn fails only on malformed data)."""
    from lore_gateway.storage.writer_sqlite import write_turns

    def plain(conn: Connection, turn: TurnRecord) -> list[int] | None:
        return write_turn(conn, turn, max_message_bytes)

    try:
        return write_turns(conn, turns, max_message_bytes, plain)
    except StorageUnavailable:
        raise
    except Exception:
        conn.rollback()
        begin_immediate(conn)
    one = _write_one(max_message_bytes)
    return [one(conn, turn) for turn in turns]


def _write_one(max_message_bytes: int) -> WriteOne:
    def one(conn: Connection, turn: TurnRecord) -> list[int] | object | None:
        return write_one(conn, turn, max_message_bytes)

    return one


def write_one(conn: Connection, turn: TurnRecord,
              max_message_bytes: int) -> list[int] | object | None:
    """One turn in its own savepoint: its message ids, None (nothing to write)
    or ``FAILED`` (logged, never its content; the batch goes on)."""
    try:
        with conn:  # a savepoint: one turn is all or nothing
            return write_turn(conn, turn, max_message_bytes)
    except StorageUnavailable:
        raise
    except Exception as exc:
        # Whatever is wrong with this turn must not cost the others.
        log.error("memory: could not store a turn of session %s (%s); skipped",
                  storable(turn.identity.session[:16]), brief(exc))
        return FAILED


def begin_immediate(conn: Connection) -> None:
    for attempt in range(BEGIN_ATTEMPTS):
        try:
            conn.begin(immediate=True)
            return
        except StorageBusy:
            if attempt == BEGIN_ATTEMPTS - 1:
                raise
            log.warning("memory: the database was locked by another process; retrying")


def brief(exc: BaseException) -> str:
    """An exception's type and message, for a log line (no traceback, no content)."""
    text = storable(str(exc))[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
