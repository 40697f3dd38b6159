"""The anchor store: verbatim pairs, persisted, bounded without evicting live anchors."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import orjson
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.store.anchor_store import AnchorStore, RecallStoreFull, StoredRecall
from lore_gateway.storage import Database, db, schema

T, S = "tenant-a", "session-1"


@pytest.fixture
def db_path(tmp_path: Path, database_url: str | None) -> Database:
    """The test's database (SQLite in tmp_path, or the Postgres of LORE_DATABASE_URL)."""
    database = Settings(data_dir=tmp_path).database
    conn = db.connect(database)
    schema.migrate(conn)
    conn.close()
    return database


def recall(text: str = "blue cluster", *, padding: int = 0) -> StoredRecall:
    call_id = "call_" + uuid.uuid4().hex[:8]
    return StoredRecall.from_messages(
        anchor_id=str(uuid.uuid4()), protocol="responses", marker=None, call_id=call_id,
        arguments='{"query":"deploy"}', position=0, context_id="c" * 64,
        assistant={"type": "function_call", "call_id": call_id, "name": "recall",
                   "arguments": '{"query":"deploy"}'},
        tool_result={"type": "function_call_output", "call_id": call_id,
                     "output": text + "x" * padding})


async def test_commit_then_lookup_is_verbatim_and_survives_a_new_store(db_path: Database) -> None:
    store = AnchorStore(db_path)
    await store.session(T, S)
    entry = recall("café ☕ \u2028 \"quoted\"")
    store.commit(T, S, [entry])
    got = (await store.session(T, S)).get(entry.anchor_id)
    assert got is not None and orjson.dumps(got.tool_result) == entry.result_json
    await store.drain()
    store.close()

    reopened = AnchorStore(db_path)
    loaded = (await reopened.session(T, S)).get(entry.anchor_id)
    assert loaded is not None
    assert loaded.assistant_json == entry.assistant_json
    assert loaded.result_json == entry.result_json
    assert (await reopened.session(T, "other-session")).get(entry.anchor_id) is None
    assert (await reopened.session("tenant-b", S)).get(entry.anchor_id) is None
    reopened.close()


async def test_commit_to_an_unloaded_session_is_seen_by_the_next_load(db_path: Database) -> None:
    store = AnchorStore(db_path)
    entry = recall()
    store.commit(T, S, [entry])  # never loaded: the commit loads it first
    assert (await store.session(T, S)).get(entry.anchor_id) is not None
    await store.drain()
    store.close()
    reopened = AnchorStore(db_path)
    assert (await reopened.session(T, S)).get(entry.anchor_id) is not None
    reopened.close()


async def test_full_session_never_evicts_live_anchors(db_path: Database) -> None:
    store = AnchorStore(db_path, max_entries=3)
    recalls = await store.session(T, S)
    first = [recall() for _ in range(3)]
    store.commit(T, S, first)
    store.touch(recalls, [e.anchor_id for e in first])  # the client still shows all three
    extra = recall()
    with pytest.raises(RecallStoreFull, match="recall store capacity exceeded"):
        store.commit(T, S, [extra])
    assert len(recalls) == 3 and recalls.get(extra.anchor_id) is None

    # The next expansion finds only the last two: the first is stale and makes room.
    store.touch(recalls, [e.anchor_id for e in first[1:]])
    store.commit(T, S, [extra])
    assert recalls.get(first[0].anchor_id) is None
    assert all(recalls.get(e.anchor_id) for e in [*first[1:], extra])
    await store.drain()
    store.close()
    reopened = AnchorStore(db_path)
    loaded = await reopened.session(T, S)
    assert sorted(loaded.entries) == sorted(e.anchor_id for e in [*first[1:], extra])
    reopened.close()


async def test_byte_capacity_is_enforced(db_path: Database) -> None:
    store = AnchorStore(db_path, max_bytes=4096)
    await store.session(T, S)
    with pytest.raises(RecallStoreFull):
        store.commit(T, S, [recall(padding=5000)])
    store.commit(T, S, [recall(padding=1000)])
    store.commit(T, S, [recall(padding=1000)])
    # Never expanded yet: both are live (created after the latest expansion).
    with pytest.raises(RecallStoreFull):
        store.commit(T, S, [recall(padding=2500)])
    store.close()


async def test_cached_sessions_are_bounded_and_reload_from_the_database(db_path: Database) -> None:
    store = AnchorStore(db_path, max_sessions=2)
    entries = {}
    for name in ("s1", "s2", "s3"):
        await store.session(T, name)
        entries[name] = recall()
        store.commit(T, name, [entries[name]])
    assert store.cached_sessions == 2
    await store.drain()
    for name, entry in entries.items():
        assert (await store.session(T, name)).get(entry.anchor_id) is not None
    assert store.cached_sessions == 2
    store.close()


@pytest.mark.sqlite_only  # writes text into an integer column, which only SQLite allows
async def test_damaged_rows_are_skipped(db_path: Database) -> None:
    good = recall()
    store = AnchorStore(db_path)
    store.commit(T, S, [good])
    await store.drain()
    store.close()
    conn = db.connect(db_path)
    conn.execute("INSERT INTO recall_anchors VALUES (?, ?, 'bad', 'responses', NULL, 'c', 'a', "
                 "'not-a-number', 'x', '{}', '{}', 0)", (T, S))
    conn.close()
    reopened = AnchorStore(db_path)
    loaded = await reopened.session(T, S)
    assert list(loaded.entries) == [good.anchor_id]
    reopened.close()


async def test_without_a_database_the_store_still_serves_its_cache() -> None:
    store = AnchorStore(None)
    await store.session(T, S)
    entry = recall()
    store.commit(T, S, [entry])
    assert (await store.session(T, S)).get(entry.anchor_id) is not None
    await store.drain()
    store.close()


async def test_a_credential_in_recall_arguments_is_redacted_on_disk(db_path: Database) -> None:
    """Redaction covers every stored field, the recall anchors included (issue 10
    §9): a key the user typed, which the model put into its recall query, never
    reaches the database; the live cache keeps the verbatim pair for replay."""
    key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"
    call_id = "call_" + uuid.uuid4().hex[:8]
    arguments = orjson.dumps({"query": f"where did I use {key}"}).decode()
    entry = StoredRecall.from_messages(
        anchor_id=str(uuid.uuid4()), protocol="responses", marker=None, call_id=call_id,
        arguments=arguments, position=0, context_id="c" * 64,
        assistant={"type": "function_call", "call_id": call_id, "name": "recall",
                   "arguments": arguments},
        tool_result={"type": "function_call_output", "call_id": call_id,
                     "output": f"the key was {key}"})
    store = AnchorStore(db_path)
    await store.session(T, S)
    store.commit(T, S, [entry])
    assert (await store.session(T, S)).get(entry.anchor_id) == entry  # verbatim in memory
    await store.drain()
    store.close()
    conn = db.connect(db_path)
    stored = conn.execute("SELECT arguments, assistant, tool_result FROM recall_anchors"
                          ).fetchone()
    conn.close()
    assert all(key not in column for column in stored)
    assert "[redacted]" in stored[0]
    assert orjson.loads(stored[1])["arguments"] == stored[0]  # still valid JSON
    reloaded = await AnchorStore(db_path).session(T, S)
    assert orjson.loads(reloaded.get(entry.anchor_id).arguments)["query"].endswith("[redacted]")


async def test_the_store_writes_through_the_memory_writer(db_path: Database) -> None:
    """No second SQLite writer: the gateway's store queues its writes on the one
    ``TurnWriter`` it is given (issue 9 §7)."""
    from lore_gateway.memory.store.writer import TurnWriter

    writer = TurnWriter(db.conn_factory(db_path), max_message_bytes=1 << 20)
    store = AnchorStore(writer=writer)
    entry = recall()
    await store.session(T, S)
    before = threading.active_count()
    store.commit(T, S, [entry])
    await store.drain()
    assert threading.active_count() == before
    assert not any(t.name.startswith("lore-anchors") for t in threading.enumerate())
    store.close()
    assert writer.flush(timeout=5)
    conn = db.connect(db_path)
    count = conn.execute("SELECT count(*) FROM recall_anchors").fetchone()[0]
    conn.close()
    writer.close()
    assert count == 1
