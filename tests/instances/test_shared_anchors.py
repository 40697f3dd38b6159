"""Recall anchors across gateways on one database: a recall stored through one
instance expands on another, even one that had the session cached before."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from lore_gateway.memory.store.anchor_store import AnchorStore, StoredRecall
from lore_gateway.recall.replay import anchor_ids
from lore_gateway.storage import db, schema

T, S = "personal", "session-1"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "lore.db"
    conn = db.connect(path)
    schema.migrate(conn)
    conn.close()
    return path


def recall(text: str) -> StoredRecall:
    call_id = "call_" + uuid.uuid4().hex[:8]
    return StoredRecall.from_messages(
        anchor_id=str(uuid.uuid4()), protocol="responses", marker=None, call_id=call_id,
        arguments='{"query":"deploy"}', position=0, context_id="c" * 64,
        assistant={"type": "function_call", "call_id": call_id, "name": "recall",
                   "arguments": '{"query":"deploy"}'},
        tool_result={"type": "function_call_output", "call_id": call_id, "output": text})


async def test_a_recall_stored_via_a_expands_on_b_that_had_the_session_cached(
        db_path: Path) -> None:
    a, b = AnchorStore(db_path), AnchorStore(db_path)
    first = recall("first answer")
    await a.session(T, S)
    a.commit(T, S, [first])
    await a.drain()
    on_b = await b.session(T, S, [first.anchor_id])
    assert on_b.get(first.anchor_id) is not None  # B's first load

    second = recall("second answer")  # the next turn went through A again
    a.commit(T, S, [second])
    await a.drain()
    on_b = await b.session(T, S, [first.anchor_id, second.anchor_id])
    got = on_b.get(second.anchor_id)
    assert got is not None and got.result_json == second.result_json
    assert on_b.get(first.anchor_id) is not None
    a.close()
    b.close()


async def test_an_anchor_found_nowhere_is_not_looked_up_again_and_again(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = AnchorStore(db_path)
    stray = str(uuid.uuid4())  # copied from another conversation: no stored recall
    await store.session(T, S, [stray])
    from lore_gateway.memory.store import anchor_store

    reads: list[object] = []
    real = anchor_store._read_session
    monkeypatch.setattr(anchor_store, "_read_session",
                        lambda conn, key: reads.append(key) or real(conn, key))
    for _ in range(3):
        assert (await store.session(T, S, [stray])).get(stray) is None
    assert reads == []
    fresh = str(uuid.uuid4())
    await store.session(T, S, [stray, fresh])
    assert len(reads) == 1
    store.close()


def test_anchor_ids_are_found_in_a_raw_body_even_with_escaped_brackets() -> None:
    one, two = str(uuid.uuid4()), str(uuid.uuid4())
    body = (f'{{"input":[{{"text":"<!-- lore-recall:{one} -->"}},'
            f'{{"text":"\\u003c!-- lore-recall:{two} --\\u003e"}},'
            f'{{"text":"<!-- lore-recall:{one} -->"}}]}}').encode()
    assert anchor_ids(body) == [one, two]
