"""``lore data forget --session | --since | --match``: the turns named, and what was
made from them, leave every table and both search indexes, with a count; a search
afterwards finds nothing (issue 36). Through the CLI, on a store with
distillations, kept recalls, context state, knowledge blocks and entries."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import orjson
import pytest
from privacy_kit import holding, index_terms, rows, search_hits
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.data.forget import parse_since
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.protocols.common import Message

PROJECT = "/work/forget-project"
HOUR = 3600.0


def build(memory: Memory) -> None:
    """Two sessions: ``alpha`` (two turns days ago, one of them about the osprey
    ledger, and one recent), ``beta`` (one old turn, one recent that names the
    osprey too); each distilled; a kept recall, a context state and a frozen
    knowledge block that quote the osprey; a knowledge entry about it."""
    now = time.time()

    def turn(session: str, age: float, user: str, answer: str) -> TurnRecord:
        return TurnRecord(Identity(PERSONAL, PROJECT, session), "anthropic", "claude-fake",
                          (Message("user", user), Message("assistant", answer)), now - age)

    for t in (turn("alpha", 72 * HOUR, "Set up the osprey ledger with key OSPREY-991 today.",
                   "The osprey ledger is set up with its key."),
              turn("alpha", 71 * HOUR, "Run the tests of the payments module.",
                   "All 212 payment tests pass."),
              turn("alpha", 0.2 * HOUR, "Ship the falcon release to staging.",
                   "The falcon release is on staging."),
              turn("beta", 48 * HOUR, "The heron relay listens on port 4817.", "Noted."),
              turn("beta", 0.1 * HOUR, "Does the osprey ledger need a backup?",
                   "Yes, nightly.")):
        assert memory.submit_turn(t)
    memory.flush(20)

    def derived(conn: Any) -> None:
        for session in ("alpha", "beta"):
            dstore.distill_extractive(conn, PERSONAL, session)
        with conn:
            conn.execute(
                "INSERT INTO recall_anchors(tenant, session, anchor_id, protocol, marker,"
                " call_id, arguments, position, context_id, assistant, tool_result, created_at)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (PERSONAL, "alpha", "a1", "anthropic", None, "call1",
                 orjson.dumps({"query": "osprey ledger key"}).decode(), 1, "ctx", "{}",
                 '"- (user) Set up the osprey ledger"', now - 70 * HOUR))
            conn.execute("INSERT INTO context_sessions(tenant, session, layer, state,"
                         " updated_at) VALUES (?,?,?,?,?)",
                         (PERSONAL, "alpha", 1, '{"prefix": "osprey ledger set up"}', now))
            conn.execute("INSERT INTO knowledge_sessions(tenant, session, project, block,"
                         " entry_ids, deltas, created_at) VALUES (?,?,?,?,?,?,?)",
                         (PERSONAL, "beta", PROJECT, "## Knowledge\n- The osprey ledger key"
                          " is OSPREY-991.", "{}", "[]", now))
        kstore.upsert(conn, tenant=PERSONAL, project=PROJECT, category="decision",
                      title="Osprey ledger", content="The osprey ledger key is OSPREY-991.")
        kstore.upsert(conn, tenant=PERSONAL, project=PROJECT, category="decision",
                      title="Heron relay", content="The heron relay listens on port 4817.",
                      source="lore ui")

    memory.write_job(derived)


def lore(memory: Memory, monkeypatch: pytest.MonkeyPatch, *args: str,
         answer: str | None = None) -> Any:
    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(memory.settings.data_dir))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    return CliRunner().invoke(app, ["data", "forget", *args], input=answer)


def contents(memory: Memory, session: str) -> list[str]:
    return [m.content for m in memory.session_messages(PERSONAL, session)
            if m.role != dstore.OBSERVATIONS_ROLE]


def test_forget_by_text_removes_it_from_every_table_and_index(
        memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    build(memory)
    assert search_hits(memory, "osprey") and holding(rows(memory), "osprey")
    result = lore(memory, monkeypatch, "--match", "OSPREY", "--yes")
    assert result.exit_code == 0, result.output
    assert "Forgot the turns containing 'OSPREY': 2 turns, 4 messages" in result.output
    assert "2 distillations, 1 knowledge entry, 1 kept recall." in result.output
    snapshot = rows(memory)
    assert holding(snapshot, "osprey") == {}
    assert index_terms(memory, "ospre") == [] and search_hits(memory, "osprey") == []
    # The rest is still there, and still found.
    assert contents(memory, "alpha")[-2:] == ["Ship the falcon release to staging.",
                                              "The falcon release is on staging."]
    assert search_hits(memory, "heron relay")
    assert [e.title for e in memory.read(lambda c: kstore.entries(c, None, None))] == [
        "Heron relay"]
    counts = {s.session: s.turns for s in memory.sessions(PERSONAL)}
    assert counts == {"alpha": 2, "beta": 1}


def test_forget_since_a_time_takes_the_recent_turns_and_what_was_made_of_them(
        memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    build(memory)
    result = lore(memory, monkeypatch, "--since", "1h", "--yes")
    assert result.exit_code == 0, result.output
    assert ": 2 turns, 4 messages" in result.output
    snapshot = rows(memory)
    for gone in ("falcon", "backup"):
        assert holding(snapshot, gone) == {}, gone
        assert index_terms(memory, gone[:5]) == [] and search_hits(memory, gone) == []
    # Distillations built from a recent message went; older turns stay, with the
    # entry a person wrote (--since takes only what the gateway learned by itself).
    for log in memory.read(lambda c: dstore.for_scope(c, None, include_archived=True)):
        assert "falcon" not in log.text and "backup" not in log.text
    assert len(contents(memory, "alpha")) == 4 and len(contents(memory, "beta")) == 2
    titles = [e.title for e in memory.read(lambda c: kstore.entries(c, None, None))]
    assert titles == ["Heron relay"]


def test_forget_a_session_deletes_it_whole_and_leaves_the_others(
        memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    build(memory)
    result = lore(memory, monkeypatch, "--session", "beta", "--yes")
    assert result.exit_code == 0, result.output
    assert "Forgot the turns of session beta: 2 turns, 4 messages, 1 whole session" \
        in result.output
    snapshot = rows(memory)
    for gone in ("heron", "backup"):
        assert search_hits(memory, gone) == [] and index_terms(memory, gone[:5]) == []
    assert not [r for name, table in snapshot.items() if name != "knowledge"
                for r in table if "'beta'" in r]
    assert [s.session for s in memory.sessions(PERSONAL)] == ["alpha"]
    assert len(contents(memory, "alpha")) == 6


def test_forget_asks_first_and_a_no_changes_nothing(memory: Memory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    build(memory)
    before = rows(memory)
    result = lore(memory, monkeypatch, "--match", "osprey", answer="n\n")
    assert result.exit_code == 1
    assert ("Forget the turns containing 'osprey' (2 turns in 2 sessions) and what was made"
            " from them?") in result.output
    assert rows(memory) == before
    result = lore(memory, monkeypatch, "--session", "nobody", "--yes")
    assert result.exit_code == 0
    assert "No stored turns of session nobody; nothing was deleted." in result.output
    assert rows(memory) == before


def test_since_reads_durations_days_and_iso_times() -> None:
    now = datetime(2025, 3, 10, 15, 30).timestamp()
    assert parse_since("30m", now) == now - 1800
    assert parse_since("2h", now) == now - 7200
    assert parse_since("3d", now) == now - 3 * 86400
    assert parse_since("1w", now) == now - 7 * 86400
    assert parse_since("today", now) == datetime(2025, 3, 10).timestamp()
    assert parse_since("yesterday", now) == datetime(2025, 3, 9).timestamp()
    assert parse_since("2025-03-01", now) == datetime(2025, 3, 1).timestamp()
    assert parse_since("2025-03-01T14:00", now) == datetime(2025, 3, 1, 14).timestamp()
    assert parse_since("2025-03-01T14:00Z", now) == 1740837600.0
    with pytest.raises(ValueError, match="is not a time: give a duration"):
        parse_since("last tuesday", now)


