"""The write path: what lands in the database file, how often, and in what shape."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db, schema
from lore_gateway.testing.postgres import indexed_ids

SECRET = "sk-proj-LoreTestSecret0123456789abcdefXYZ"


@pytest.fixture
def settings(tmp_path: Path, database_url: str | None) -> Settings:
    return Settings(data_dir=tmp_path / "lore")


@pytest.fixture
def memory(settings: Settings) -> Iterator[Memory]:
    mem = Memory.open(settings, embedder=None)
    yield mem
    mem.close()


def rows(settings: Settings, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    from lore_gateway.storage import db

    conn = db.connect(settings.database, readonly=True)
    try:
        return [tuple(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


def turn(ident: Identity, *texts: tuple[str, str], complete: bool = True,
         dedup_key: str | None = None, at: float | None = None) -> TurnRecord:
    return TurnRecord(
        identity=ident, protocol="responses", model="gpt-test",
        messages=tuple(Message(role, text) for role, text in texts),  # type: ignore[arg-type]
        created_at=time.time() if at is None else at, complete=complete, dedup_key=dedup_key,
    )


def store_as_one_batch(settings: Settings, backlog: list[TurnRecord]) -> Memory:
    """Submit ``backlog`` while a job holds the writer, so the turns queue up and
    are written as one batch; the memory comes back closed, for its counters."""
    memory = Memory.open(settings, embedder=None)
    try:
        release = threading.Event()
        assert memory._writer.submit_job(lambda conn: release.wait(10)) is not None
        for record in backlog:
            assert memory.submit_turn(record)
        release.set()
        memory.flush(10)
    finally:
        memory.close()
    return memory


ALICE = Identity(tenant="t-alice", project="/home/a/proj", session="s-1")


def test_completed_turn_is_stored_once_with_token_estimates(memory: Memory,
                                                            settings: Settings) -> None:
    pending = memory.begin_turn(ALICE, protocol="anthropic", model="claude-x",
                                inputs=[Message("user", "what is the build command?")])
    assert pending.complete([Message("assistant", "run `make build` (needs go 1.22)"),
                             Message("tool", "[tool:shell] ok")])
    # The proxy's finally-block call after a completed turn must not store it again.
    assert not pending.abandon([Message("assistant", "partial")])
    assert not pending.complete([Message("assistant", "again")])
    memory.flush(5)

    assert rows(settings, "SELECT protocol, model, complete, session, project FROM turns") == [
        ("anthropic", "claude-x", 1, "s-1", "/home/a/proj")]
    stored = rows(settings, "SELECT seq, role, content, tokens FROM messages ORDER BY seq")
    assert stored == [
        (0, "user", "what is the build command?", 9),  # ceil(26 / 3)
        (1, "assistant", "run `make build` (needs go 1.22)", 11),
        (2, "tool", "[tool:shell] ok", 5),
    ]
    assert rows(settings, "SELECT turns FROM sessions WHERE id = 's-1'") == [(1,)]
    # The FTS index follows the table.
    assert indexed_ids(settings.database, "build") == [1, 2]


def test_abandoned_turn_keeps_input_and_partial_output_and_a_retry_replaces_it(
        memory: Memory, settings: Settings) -> None:
    question = [Message("user", "refactor the parser into two modules")]
    first = memory.begin_turn(ALICE, protocol="codex", model=None, inputs=question)
    assert first.abandon([Message("assistant", "Sure, first I will")])
    memory.flush(5)
    assert rows(settings, "SELECT complete FROM turns") == [(0,)]
    assert [r[0] for r in rows(settings, "SELECT content FROM messages ORDER BY id")] == [
        "refactor the parser into two modules", "Sure, first I will"]

    retry = memory.begin_turn(ALICE, protocol="codex", model=None, inputs=question)
    assert retry.complete([Message("assistant", "Done: parser/lexer.py and parser/ast.py")])
    memory.flush(5)
    assert rows(settings, "SELECT complete FROM turns") == [(1,)]
    assert [r[0] for r in rows(settings, "SELECT content FROM messages ORDER BY id")] == [
        "refactor the parser into two modules", "Done: parser/lexer.py and parser/ast.py"]
    assert rows(settings, "SELECT turns FROM sessions") == [(1,)]
    # Only the superseded attempt's FTS rows are gone.
    assert indexed_ids(settings.database, "first") == []


def test_a_retried_tool_loop_step_replaces_its_failed_attempt(
        memory: Memory, settings: Settings) -> None:
    step = [Message("tool", "[tool:shell] 3 tests failed")]
    memory.begin_turn(ALICE, protocol="chat", model=None, inputs=step).abandon()
    memory.begin_turn(ALICE, protocol="chat", model=None,
                      inputs=step).complete([Message("assistant", "fixing them")])
    memory.flush(5)
    assert rows(settings, "SELECT complete FROM turns") == [(1,)]


def test_abandoned_turn_with_different_input_is_kept(memory: Memory, settings: Settings) -> None:
    memory.begin_turn(ALICE, protocol="chat", model=None,
                      inputs=[Message("user", "one")]).abandon()
    memory.begin_turn(ALICE, protocol="chat", model=None,
                      inputs=[Message("user", "two")]).complete([Message("assistant", "2")])
    memory.flush(5)
    assert rows(settings, "SELECT complete FROM turns ORDER BY id") == [(0,), (1,)]


@pytest.mark.usefixtures("database_url")
def test_long_message_is_truncated_with_a_note(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, store_max_message_bytes=1000)
    mem = Memory.open(settings, embedder=None)
    try:
        huge = "x" * 1500
        mem.submit_turn(turn(ALICE, ("user", "cat big.log"), ("tool", huge)))
        mem.flush(5)
    finally:
        mem.close()
    (content, truncated), = rows(settings, "SELECT content, truncated FROM messages WHERE seq = 1")
    assert truncated == 1
    assert content == "x" * 1000 + "\n[lore: truncated 500 of 1,500 bytes]"


def test_markers_anchors_and_credentials_never_reach_the_file(
        memory: Memory, settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"authorization": f"Bearer {SECRET}"}
    body = {"input": [{"role": "user", "content": f"my key is {SECRET}, keep it safe"}]}
    ident = memory.identify("responses", headers, body)
    assert SECRET not in repr(ident)
    memory.begin_turn(ident, protocol="responses", model="m", inputs=[
        Message("user", f"my key is {SECRET}, keep it safe"),
        Message("user", 'curl -H "x-api-key: plainvalue123" https://api.example'),
    ]).complete([Message("assistant",
                         '📚 Searching project archives for "api key"…\n'
                         "<!-- lore-recall:123e4567-e89b-42d3-a456-426614174000 -->\n"
                         "I will not repeat it. Authorization: Bearer tok_abcdefgh12345")])
    memory.flush(5)
    memory.close()

    contents = [r[0] for r in rows(settings, "SELECT content FROM messages ORDER BY id")]
    assert contents == [
        "my key is [redacted], keep it safe",
        'curl -H "x-api-key: [redacted]" https://api.example',
        "I will not repeat it. Authorization: Bearer [redacted]",
    ]
    for path in settings.data_dir.iterdir() if settings.data_dir.exists() else ():
        data = path.read_bytes()
        for needle in (SECRET, "plainvalue123", "tok_abcdefgh12345", "lore-recall:", "📚"):
            assert needle.encode() not in data, f"{needle!r} found in {path.name}"
    assert SECRET not in caplog.text


def test_dedup_key_makes_a_repeat_a_no_op_and_a_new_version_replaces(
        memory: Memory, settings: Settings) -> None:
    memory.submit_turn(turn(ALICE, ("user", "q"), ("assistant", "a"), dedup_key="f:1#v1"))
    memory.submit_turn(turn(ALICE, ("user", "q"), ("assistant", "a"), dedup_key="f:1#v1"))
    memory.flush(5)
    assert rows(settings, "SELECT COUNT(*) FROM turns") == [(1,)]
    memory.submit_turn(turn(ALICE, ("user", "q"), ("assistant", "a, and more"),
                            dedup_key="f:1#v2"))
    memory.flush(5)
    assert rows(settings, "SELECT dedup_key FROM turns") == [("f:1#v2",)]
    assert rows(settings, "SELECT content FROM messages WHERE role = 'assistant'") == [
        ("a, and more",)]
    assert rows(settings, "SELECT turns FROM sessions") == [(1,)]


@pytest.mark.sqlite_only  # stalls the writer with SQLite's file lock
def test_submit_never_blocks_when_the_queue_is_full(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    from lore_gateway.memory.store.writer import MAX_TURNS_PER_COMMIT, TurnWriter
    from lore_gateway.storage.db import conn_factory

    Memory.open(settings, embedder=None).close()  # create the schema
    blocker = apsw.Connection(str(settings.db_path))
    blocker.set_busy_timeout(0)
    blocker.execute("BEGIN IMMEDIATE")  # hold the write lock: the writer stalls
    writer = TurnWriter(conn_factory(settings.database), max_message_bytes=1000, max_queue=3)
    try:
        started = time.monotonic()
        accepted = [writer.submit(turn(ALICE, ("user", f"q{i}"))) for i in range(300)]
        assert time.monotonic() - started < 0.5
        # The stalled writer holds at most one batch; the queue holds three more.
        assert accepted[:3] == [True] * 3
        assert accepted.count(True) <= 3 + 1 + MAX_TURNS_PER_COMMIT
        assert accepted.count(False) >= 300 - (3 + 1 + MAX_TURNS_PER_COMMIT)
        assert writer.dropped == accepted.count(False)
        # One warning for the burst, not one per dropped turn.
        assert [r.message for r in caplog.records if "queue is full" in r.message] == [
            "memory write queue is full (3 turns); turns are not being stored "
            "(1 dropped so far)"]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        writer.close()
    # What was accepted was written, once.
    assert rows(settings, "SELECT COUNT(*) FROM turns") == [(accepted.count(True),)]


def test_tenants_do_not_see_each_other(memory: Memory) -> None:
    bob = Identity(tenant="t-bob", project="/home/a/proj", session="s-1")
    memory.submit_turn(turn(ALICE, ("user", "alice's deploy notes")))
    memory.submit_turn(turn(bob, ("user", "bob's deploy notes")))
    memory.flush(5)
    assert [s.tenant for s in memory.sessions("t-alice")] == ["t-alice"]
    assert [m.content for m in memory.session_messages("t-bob", "s-1")] == ["bob's deploy notes"]
    hits = memory.search_sync("deploy notes", identity=ALICE, scope="all").hits
    assert [h.content for h in hits] == ["alice's deploy notes"]
    bob_ref = memory.session_messages("t-bob", "s-1")[0].ref
    assert memory.detail_sync(bob_ref, tenant="t-alice") == f"No entry found for id: {bob_ref}"
    assert "bob's deploy notes" in memory.detail_sync(bob_ref, tenant="t-bob")
    # Deleting alice's session leaves bob's session of the same id alone.
    assert memory.delete("t-alice", session="s-1") == 1
    assert [s.tenant for s in memory.sessions(None)] == ["t-bob"]


def test_detail_returns_bounded_windows(memory: Memory) -> None:
    text = "".join(f"{i:05d} " for i in range(5000))  # 30,000 characters
    memory.submit_turn(turn(ALICE, ("tool", text)))
    memory.flush(5)
    ref = memory.session_messages("t-alice", "s-1")[0].ref
    first = memory.detail_sync(ref, tenant="t-alice")
    assert first.startswith(f"## Recall Detail: {ref}\n")
    assert text[:12_000] in first and text[12_000:12_010] not in first
    assert "detailOffset 12000" in first
    last = memory.detail_sync(ref, tenant="t-alice", offset=24_000, limit=99_999)
    assert text[24_000:] in last and "detailOffset" not in last
    assert memory.detail_sync("k:1", tenant="t-alice") == 'Unknown source prefix "k" in id: k:1'


def test_delete_project_removes_messages_index_rows_and_sessions(
        memory: Memory, settings: Settings) -> None:
    other = Identity(tenant="t-alice", project="/elsewhere", session="s-2")
    memory.submit_turn(turn(ALICE, ("user", "zebra facts")))
    memory.submit_turn(turn(ALICE, ("user", "more zebra")))
    memory.submit_turn(turn(other, ("user", "zebra elsewhere")))
    memory.flush(5)
    seen: list[tuple[int, int]] = []
    assert memory.delete("t-alice", project="/home/a/proj",
                         progress=lambda done, total: seen.append((done, total))) == 2
    assert seen[-1] == (2, 2)
    assert rows(settings, "SELECT project FROM messages") == [("/elsewhere",)]
    assert [(i,) for i in indexed_ids(settings.database, "zebra")] \
        == rows(settings, "SELECT id FROM messages")
    assert [s.session for s in memory.sessions("t-alice")] == ["s-2"]


def test_schema_is_versioned_and_refuses_a_newer_database(settings: Settings) -> None:
    Memory.open(settings, embedder=None).close()
    Memory.open(settings, embedder=None).close()
    conn = db.connect(settings.database)
    assert rows(settings, "SELECT version FROM schema_version") == [
        (m.version,) for m in schema.migrations_for(conn)]
    conn.execute("INSERT INTO schema_version(version) VALUES (999)")
    conn.close()
    with pytest.raises(RuntimeError, match="schema version 999"):
        Memory.open(settings, embedder=None)


_CRASH_WRITER = """
import sys, time
from pathlib import Path
from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message
from lore_gateway.testing.postgres import indexed_ids
mem = Memory.open(Settings(data_dir=Path(sys.argv[1])), embedder=None)
ident = Identity("t-crash", "/p", "s")
i = 0
while True:
    msgs = tuple(Message("user" if k % 2 == 0 else "assistant", f"turn {i} part {k} " * 50)
                 for k in range(4))
    mem.submit_turn(TurnRecord(ident, "chat", None, msgs, time.time()), wait=True)
    if i == 200:
        mem.flush()
        print("writing", flush=True)
    i += 1
"""


@pytest.mark.sqlite_only  # SQLite's integrity checks of the file and its FTS5 index
def test_a_writer_killed_mid_write_leaves_a_consistent_database(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CRASH_WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        time.sleep(0.3)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    conn = apsw.Connection(str(tmp_path / "lore.db"))
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    turns = conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    assert turns > 200
    # Only whole turns: every stored turn has all four of its messages.
    assert conn.execute(
        "SELECT COUNT(*) FROM (SELECT turn_id, COUNT(*) AS n FROM messages GROUP BY turn_id)"
        " WHERE n != 4").fetchone() == (0,)
    assert conn.execute("SELECT COUNT(DISTINCT turn_id) FROM messages").fetchone() == (turns,)
    assert conn.execute("SELECT turns FROM sessions").fetchone() == (turns,)


@pytest.mark.usefixtures("database_url")
def test_deleting_a_session_removes_its_replayable_recalls(tmp_path: Path) -> None:
    from lore_gateway.storage import db as _db

    settings = Settings(data_dir=tmp_path, embeddings=False)
    mem = Memory.open(settings, embedder=None)
    ident = Identity(tenant="t1", project="/p", session="s1")
    assert mem.submit_turn(TurnRecord(identity=ident, protocol="responses", model="m",
                                      messages=(Message("user", "hello"),),
                                      created_at=time.time()))
    mem.flush(timeout=10)
    conn = _db.connect(settings.database)
    with conn:
        conn.execute(
            "INSERT INTO recall_anchors(tenant, session, anchor_id, protocol, marker, call_id,"
            " arguments, position, context_id, assistant, tool_result, created_at)"
            " VALUES ('t1','s1','a1','responses','m','c','{}',0,'x','{}','{}',0)")
    mem.delete("t1", session="s1")
    assert conn.execute("SELECT COUNT(*) FROM recall_anchors").fetchall() == [(0,)]
    conn.close()
    mem.close()


def test_a_backlog_written_as_one_batch_stores_what_turn_by_turn_writes_store(
        settings: Settings) -> None:
    """Turns that queue up behind a busy writer share one batch (on Postgres written
    set-wise, with a retry, a dedup-keyed import and an empty turn among them): the
    rows, their order, the session counts and the search index are what writing
    them one at a time gives."""
    from lore_gateway.memory.search.query import phrase
    from lore_gateway.memory.search.textindex import text_index

    bob = Identity(tenant="t-alice", project="/home/a/other", session="s-2")
    backlog = [
        turn(ALICE, ("user", "where is the zebra config?"), ("assistant", "in etc"), at=1.0),
        turn(ALICE, ("user", "rename the walrus module"), ("assistant", "Sure"),
             complete=False, at=2.0),
        turn(bob, ("user", "bob asks about okapi"), at=3.0),
        turn(ALICE, ("user", "rename the walrus module"), ("assistant", "renamed to seal"),
             at=4.0),
        turn(ALICE, ("user", "   "), at=5.0),
        turn(bob, ("user", "imported narwhal note"), dedup_key="imp-1", at=6.0),
        turn(bob, ("user", "imported narwhal note"), dedup_key="imp-1", at=7.0),
        turn(ALICE, ("assistant", "answer about the zebra"), at=8.0),
    ]
    store_as_one_batch(settings, backlog)

    assert rows(settings, "SELECT session, complete, created_at FROM turns ORDER BY id") == [
        ("s-1", 1, 1.0), ("s-2", 1, 3.0), ("s-1", 1, 4.0), ("s-2", 1, 6.0), ("s-1", 1, 8.0)]
    assert [r[0] for r in rows(settings, "SELECT content FROM messages ORDER BY id")] == [
        "where is the zebra config?", "in etc", "bob asks about okapi",
        "rename the walrus module", "renamed to seal", "imported narwhal note",
        "answer about the zebra"]
    assert rows(settings, "SELECT id, project, first_seen, last_seen, turns FROM sessions"
                          " ORDER BY id") == [("s-1", "/home/a/proj", 1.0, 8.0, 3),
                                              ("s-2", "/home/a/other", 3.0, 6.0, 2)]
    ids = [r[0] for r in rows(settings, "SELECT id FROM messages ORDER BY id")]
    assert indexed_ids(settings.database, "zebra") == [ids[0], ids[6]]
    assert indexed_ids(settings.database, "sure") == []  # the superseded attempt
    conn = db.connect(settings.database)
    try:
        # The context index holds each message with the one before it in its session.
        index = text_index(conn)
        in_context = index.newest(conn, "context", [phrase("seal", prefix=False)],
                                  conjunction=False, token=None, limit=10)
        after_etc = index.newest(conn, "context", [phrase("etc", prefix=False)],
                                 conjunction=False, token=None, limit=10)
    finally:
        conn.close()
    assert sorted(in_context) == [ids[4], ids[6]]
    assert sorted(after_etc) == [ids[1], ids[3]]


def test_a_long_backlog_keeps_every_turn_in_order_and_indexed(settings: Settings) -> None:
    """A backlog of 75 turns of two messages over two sessions (150 message rows,
    more than one multi-row statement holds): every row in submission order,
    each message found by its own word, each session's count and bounds."""
    sessions = (ALICE, Identity(tenant="t-alice", project="/home/a/other", session="s-2"))
    backlog = [turn(sessions[n % 2], ("user", f"question q{n}x"), ("assistant", f"answer a{n}x"),
                    at=float(n)) for n in range(75)]
    store_as_one_batch(settings, backlog)

    messages = rows(settings, "SELECT id, turn_id, seq, content FROM messages ORDER BY id")
    turns = [r[0] for r in rows(settings, "SELECT id FROM turns ORDER BY created_at")]
    assert [(turn_id, seq, content) for _, turn_id, seq, content in messages] == [
        (turns[n], seq, text) for n in range(75)
        for seq, text in enumerate((f"question q{n}x", f"answer a{n}x"))]
    assert indexed_ids(settings.database, "q74x") == [messages[148][0]]
    assert indexed_ids(settings.database, "a0x") == [messages[1][0]]
    assert all(indexed_ids(settings.database, f"a{n}x") == [messages[2 * n + 1][0]]
               for n in range(0, 75, 7))
    assert rows(settings, "SELECT id, first_seen, last_seen, turns FROM sessions ORDER BY id"
                ) == [("s-1", 0.0, 74.0, 38), ("s-2", 1.0, 73.0, 37)]


def test_a_turn_failing_inside_a_batch_costs_only_itself(settings: Settings) -> None:
    """A batch is written without a savepoint per turn; a turn that fails halfway
    (its turn row and first message already inserted) makes the batch start over
    turn by turn: the others are stored, in order and indexed, the failed one
    leaves no row behind."""
    good = [turn(ALICE, ("user", f"question about the gecko {n}"), ("assistant", f"ok {n}"),
                 at=float(n)) for n in range(4)]
    bad = TurnRecord(identity=Identity("t-alice", "/home/a/proj", "s-bad"), protocol="chat",
                     model=None, created_at=9.0,
                     messages=(Message("user", "the iguana question"), Message("assistant", "x")),
                     metas=({}, {"not json": object()}))
    memory = store_as_one_batch(settings, [good[0], good[1], bad, good[2], good[3]])
    assert memory._writer.failed == 1
    assert memory._writer.written == 4

    assert rows(settings, "SELECT session, created_at FROM turns ORDER BY id") == [
        ("s-1", 0.0), ("s-1", 1.0), ("s-1", 2.0), ("s-1", 3.0)]
    assert [r[0] for r in rows(settings, "SELECT content FROM messages ORDER BY id")] == [
        text for n in range(4) for text in (f"question about the gecko {n}", f"ok {n}")]
    assert rows(settings, "SELECT id, turns FROM sessions") == [("s-1", 4)]
    assert len(indexed_ids(settings.database, "gecko")) == 4
    assert indexed_ids(settings.database, "iguana") == []


def test_a_commit_waits_for_company_but_never_holds_up_a_flush(settings: Settings) -> None:
    """With a group wait (the storage process's), turns submitted one after another
    share one commit, and a flush returns without waiting out the wait."""
    from lore_gateway.memory.store.writer import TurnWriter

    conn = db.connect(settings.database)
    schema.migrate(conn)
    conn.close()
    commits: list[list[int]] = []
    writer = TurnWriter(db.conn_factory(settings.database), max_message_bytes=1 << 16,
                        on_commit=commits.append, on_stored=lambda n: None,
                        group_wait_s=600.0)
    try:
        for n in range(5):
            assert writer.submit(turn(ALICE, ("user", f"q {n}"), ("assistant", f"a {n}")))
        assert writer.flush(30)
        assert [len(ids) for ids in commits] == [10]
        assert writer.written == 5
    finally:
        writer.close(30)
