"""Turns written in the storage process (memory/store/process.py) and the pipe
that feeds it (memory/store/turn_pipe.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.turn_pipe import PipeClosed, PipeReceiver, PipeSender, make_pipe
from lore_gateway.protocols.common import Message

IDENT = Identity("personal", "/work/app", "s1")


def turn(n: int, text: str = "") -> TurnRecord:
    return TurnRecord(identity=IDENT, protocol="chat", model="m", created_at=float(n),
                      messages=(Message("user", text or f"question {n}"),
                                Message("assistant", f"answer {n}")))


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None,
                      turn_process=True)
    yield mem
    mem.close()


def test_turns_are_written_by_the_storage_process_and_jobs_run_behind_them(
        memory: Memory) -> None:
    assert memory._turn_store is not None and memory._turn_store.alive
    for n in range(40):
        assert memory.submit_turn(turn(n))
    # A job sees every turn submitted before it (compaction and deletions rely on it).
    count = memory.write_job(
        lambda conn: conn.execute("SELECT count(*) FROM turns").fetchone()[0])
    assert count == 40
    assert memory.written_turns == 40
    assert memory.queue_depth == 0
    assert memory.degraded is None


def test_stored_text_is_cleaned_in_the_storage_process(memory: Memory) -> None:
    assert memory.submit_turn(turn(1, "a lone \ud800 surrogate and a NUL \x00"))
    memory.flush(30)
    stored = [m.content for m in memory.session_messages("personal", "s1")]
    assert stored[0] == "a lone \ufffd surrogate and a NUL \ufffd"


@pytest.mark.usefixtures("database_url")
def test_close_writes_every_queued_turn(tmp_path: Path) -> None:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None,
                      turn_process=True)
    for n in range(300):
        assert mem.submit_turn(turn(n))
    mem.close()
    again = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    try:
        assert again.count_turns("personal", session="s1") == 300
    finally:
        again.close()


def test_the_pipe_keeps_order_past_a_full_pipe_and_reports_the_end() -> None:
    read_fd, write_fd = make_pipe()
    sender = PipeSender(write_fd)
    big = "x" * (3 << 20)  # more than the pipe holds: the rest goes to the backlog
    received: list[object] = []
    sender.send(("first", 1))
    sender.send(big)  # never blocks, although nobody reads yet
    sender.send(("last", 3))
    receiver = PipeReceiver(read_fd)

    def read() -> None:
        while True:
            try:
                received.extend(receiver.receive(1.0))
            except PipeClosed:
                return

    reading = threading.Thread(target=read)
    reading.start()
    sender.close()  # drains the backlog, then closes: the receiver sees the end
    reading.join(30)
    assert not reading.is_alive()
    assert received == [("first", 1), big, ("last", 3)]
    receiver.close()


def test_sending_to_a_closed_pipe_raises() -> None:
    read_fd, write_fd = make_pipe()
    os.close(read_fd)
    sender = PipeSender(write_fd)
    with pytest.raises(PipeClosed):
        sender.send("nobody reads this")
    sender.close()


def test_a_turn_crosses_the_pipe_as_builtins_and_comes_back_equal() -> None:
    """The hand-off format (records.turn_to_wire): every field of a turn and of a
    raw turn survives, and nothing but builtins is pickled."""
    import pickle

    from lore_gateway.memory.store.records import (
        RawOutputs,
        RawTurn,
        RecallRow,
        turn_from_wire,
        turn_to_wire,
    )

    record = TurnRecord(identity=IDENT, protocol="responses", model=None, created_at=1.5,
                        messages=(Message("user", "q"), Message("assistant", "a")),
                        complete=False, dedup_key="k#2",
                        metas=({"side_channel": True}, None))
    raw = RawTurn(turn(3), RawOutputs("anthropic", b"event: x\ndata: {}\n\n",
                                      recalls=(RecallRow("a-1", Message("assistant", "c")),
                                               RecallRow(None, Message("assistant", "d")))),
                  side_channel="helper")
    for original in (record, raw, turn(4)):
        wire = turn_to_wire(original)
        data = pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)
        assert b"lore_gateway" not in data  # no class of ours to import on the other side
        assert turn_from_wire(pickle.loads(data)) == original
