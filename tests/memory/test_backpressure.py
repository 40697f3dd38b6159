"""A memory writer that falls behind slows new requests down; it never drops turns.

Found by `lore bench soak` on an idle machine: 200 clients outran the writer, its
queue filled and 5,649 of 42,687 completed turns were dropped. Now the proxy holds
a new request back (TurnSink.admit) until the queue has room for every request
already running.
"""

from __future__ import annotations

import asyncio
import threading

from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.turns import TurnSink

IDENT = Identity("personal", "/work/app", "s1")


def turn(n: int) -> TurnRecord:
    return TurnRecord(identity=IDENT, protocol="chat", model="m",
                      messages=(Message("user", f"question {n}"),), created_at=float(n))


async def test_a_full_writer_queue_holds_new_requests_back_instead_of_dropping(
        memory: Memory) -> None:
    sink = TurnSink(memory, max_json_bytes=1 << 20)
    release = threading.Event()
    started = threading.Event()

    def stall(_conn: object) -> None:
        started.set()
        release.wait(30)

    memory.writer.submit_job(stall)  # the writer thread is busy until released
    assert started.wait(10)
    in_flight = 50
    queued = memory.writer.capacity - in_flight + 1
    for n in range(queued):
        assert memory.submit_turn(turn(n))
    assert memory.backlogged(in_flight)

    admitted = asyncio.ensure_future(sink.admit(in_flight))
    await asyncio.sleep(0.2)
    assert not admitted.done(), "a request went on while the queue had no room for its turn"

    release.set()
    await asyncio.wait_for(admitted, 20)
    for n in range(queued, queued + in_flight):  # every running request stores its turn
        assert memory.submit_turn(turn(n))
    memory.flush(60)
    assert memory.dropped_turns == 0
    assert memory.count_turns("personal", session="s1") == queued + in_flight


async def test_a_writer_with_room_admits_at_once(memory: Memory) -> None:
    sink = TurnSink(memory, max_json_bytes=1 << 20)
    await asyncio.wait_for(sink.admit(1000), 1)
    await asyncio.wait_for(TurnSink(None, max_json_bytes=1).admit(1000), 1)
