"""``lore db copy``: a personal SQLite memory moved into another database keeps every
row (counted) and answers a fixed query set exactly as before, resumes after an
interruption, and can land under a person's tenant in a team database that
already holds someone else's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lore_gateway.config import Settings
from lore_gateway.distill import store as dstore
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.embed.embedder import MODEL_NAME
from lore_gateway.memory.search.searcher import Searcher
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.tenancy import keys
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db, dbcopy
from lore_gateway.storage.base import Database
from lore_gateway.storage.target import parse_url

REPO = Path(__file__).resolve().parents[2]
TOPICS = ("deploy key vault rotation", "flaky integration test timeout", "postgres pool size",
          "release branch naming", "docker image cache", "python packaging uv lockfile")
QUERIES = ("deploy key", "vault rotation monthly", "integration timeout", "pool size",
           "release branch", "docker cache layers", "uv lockfile", "nothing matches zebra")


def _corpus(memory: Memory, tenant: str = "personal", sessions: int = 6, turns: int = 12) -> None:
    for s in range(sessions):
        ident = Identity(tenant, f"/work/project-{s % 2}", f"{tenant}-session-{s}")
        for t in range(turns):
            topic = TOPICS[(s + t) % len(TOPICS)]
            memory.submit_turn(TurnRecord(
                identity=ident, protocol="responses", model="gpt-fake",
                messages=(Message("user", f"Question {t} about the {topic} in session {s}?"),
                          Message("assistant", f"Answer {t}: we settled the {topic} by "
                                               f"writing it down (turn {t}, session {s}).")),
                created_at=1.7e9 + s * 1000 + t), wait=True)
    memory.flush()


def populate(target: Database, tmp: Path, tenant: str = "personal") -> None:
    """A memory with every kind of row: turns, messages, vectors, distillations,
    knowledge, recall anchors, sessions, worker usage and a gateway key."""
    settings = Settings(data_dir=tmp, embeddings=False, database_url=_raw_url(target))
    memory = Memory.open(settings, embedder=None)
    try:
        _corpus(memory, tenant)

        def extras(conn: Any) -> None:
            rows = conn.execute("SELECT id, content, created_at FROM messages WHERE tenant = ?"
                                " ORDER BY id LIMIT 6", (tenant,)).fetchall()
            sources = [SourceMessage(int(r[0]), "user", str(r[1]), float(r[2])) for r in rows]
            dstore.save(conn, tenant=tenant, project="/work/project-0",
                        session=f"{tenant}-session-0", text="- deploy key lives in the vault",
                        sources=sources, generation=0, method="extractive",
                        input_tokens=10_000)
            kstore.upsert(conn, tenant=tenant, project="/work/project-0", category="decision",
                          title="Deploy keys rotate monthly", content="Rotate the deploy key "
                          "in the vault every month.")
            conn.execute("INSERT INTO recall_anchors(tenant, session, anchor_id, protocol,"
                         " marker, call_id, arguments, position, context_id, assistant,"
                         " tool_result, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                         (tenant, f"{tenant}-session-0", f"anchor-{tenant}", "responses", None,
                          "call_1", '{"query":"deploy"}', 0, "c" * 64, '{"type":"a"}',
                          '{"type":"b"}', 1.7e9))
            conn.execute("INSERT INTO knowledge_sessions(tenant, session, project, block,"
                         " entry_ids, deltas, created_at) VALUES (?, ?, '/work/project-0',"
                         " 'frozen block', '{}', '[]', 1.7e9)", (tenant, f"{tenant}-session-0"))
            conn.execute("INSERT INTO worker_usage(tenant, day, requests, tokens_in,"
                         " tokens_out) VALUES (?, '2026-12-01', 1, 100, 20)", (tenant,))
            ids = [int(r[0]) for r in conn.execute(
                "SELECT id FROM messages WHERE tenant = ? ORDER BY id", (tenant,))]
            rng = np.random.default_rng(len(tenant))
            vectors = rng.standard_normal((len(ids), 384)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            blob = target.backend == "sqlite"
            cast = "?" if blob else "CAST(? AS vector)"
            with conn:
                for mid, vec in zip(ids, vectors, strict=True):
                    conn.execute(f"INSERT INTO embeddings(message_id, model, vector) VALUES"
                                 f" (?, ?, {cast})", (mid, MODEL_NAME, vec.astype("<f4").tobytes()
                                                      if blob else dbcopy._vector_for(
                                                          "postgres", vec)))

        memory.write_job(extras)
        if tenant != "personal":
            conn = db.connect(target)
            try:
                keys.create(conn, tenant)
            finally:
                conn.close()
    finally:
        memory.close()


def results(target: Database, tenant: str, *, by_content: bool = False) -> list[list[Any]]:
    """Each query's hits: (ref, score) in rank order; ``by_content``: the set of
    texts found (beside another tenant's memory, BM25's corpus statistics and so
    the scores and ties move, but what matches does not)."""
    searcher = Searcher(db.conn_factory(target), None)
    # ``by_content`` asks from no project: from one, the other project's matches are
    # demoted (memory/search/projects.py) among the weak ones the cut at 50 falls in.
    project = "" if by_content else "/work/project-0"
    out = []
    for query in QUERIES:
        found = searcher.search(query, tenant=tenant, project=project,
                                session=f"{tenant}-session-0", scope="all",
                                limit=50 if by_content else 10)
        out.append(sorted((h.content, h.role) for h in found.hits) if by_content
                   else [(h.ref, round(h.score, 3)) for h in found.hits])
    return out


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        yield parse_url(f"sqlite:///{tmp_path / 'target' / 'lore.db'}")
    else:
        yield parse_url(request.getfixturevalue("postgres_url"))


@pytest.fixture
def source(tmp_path: Path) -> Database:
    path = tmp_path / "personal"
    path.mkdir()
    found = parse_url(f"sqlite:///{path / 'lore.db'}")
    populate(found, path)
    return found


def test_a_copy_has_the_same_rows_and_the_same_recall_results(
        source: Database, target: Database) -> None:
    result = dbcopy.copy(source, target)
    assert result.ok, result.counts
    by_table = {c.table: c for c in result.counts}
    assert by_table["messages"].source == 145 and by_table["embeddings"].source == 145
    assert all(c.source > 0 for c in result.counts if c.table != "gateway_keys"), result.counts
    assert result.plan.offsets == {"turns": 0, "messages": 0, "distillations": 0}
    assert results(target, "personal") == results(source, "personal")
    assert any(results(source, "personal"))

    again = dbcopy.copy(source, target)  # a second run copies nothing more
    assert again.resumed and again.ok
    assert all(c.copied_now == 0 for c in again.counts if c.table in
               ("turns", "messages", "embeddings", "distillations"))


def test_an_interrupted_copy_resumes_where_it_stopped(
        source: Database, target: Database) -> None:
    calls = 0

    def stop_in_messages(table: str, done: int, total: int) -> None:
        nonlocal calls
        if table == "messages":
            calls += 1
            if calls == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dbcopy.copy(source, target, batch_rows=40, progress=stop_in_messages)
    conn = db.connect(target)
    try:
        partial = int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])  # type: ignore[index]
    finally:
        conn.close()
    assert partial == 80  # two committed batches, nothing half-written
    result = dbcopy.copy(source, target, batch_rows=40)
    assert result.resumed and result.ok, result.counts
    assert {c.table: c.copied_now for c in result.counts}["messages"] == 65
    assert results(target, "personal") == results(source, "personal")


def test_a_personal_memory_moves_under_a_tenant_beside_another_persons(
        source: Database, target: Database, tmp_path: Path) -> None:
    (tmp_path / "team").mkdir()
    populate(target, tmp_path / "team", tenant="bob")
    bob_before = results(target, "bob", by_content=True)
    result = dbcopy.copy(source, target, tenant="alice")
    assert result.ok, result.counts
    assert result.plan.offsets["messages"] == 145
    assert results(target, "alice", by_content=True) == results(source, "personal",
                                                                by_content=True)
    assert results(target, "bob", by_content=True) == bob_before
    assert results(target, "personal") == [[] for _ in QUERIES]
    conn = db.connect(target)
    try:
        # A distillation's sources moved with the messages they name.
        (ids,) = conn.execute("SELECT source_ids FROM distillations WHERE tenant = 'alice'"
                              ).fetchone() or ("[]",)
        marks = ",".join(str(i) for i in json.loads(ids))
        owners = {str(r[0]) for r in conn.execute(
            f"SELECT DISTINCT tenant FROM messages WHERE id IN ({marks})")}
        assert owners == {"alice"}
        # The next turn a gateway writes gets a fresh id (Postgres identities moved on).
        turn = conn.insert("INSERT INTO turns(tenant, project, session, protocol, created_at,"
                           " complete) VALUES ('alice', '/p', 'new', 'responses', ?, 1)",
                           (time.time(),))
        assert turn > 2 * 72
    finally:
        conn.close()
    with pytest.raises(dbcopy.CopyError, match="already holds memory of tenant 'bob'"):
        _copy_fresh(target, "bob", tmp_path)


def _copy_fresh(target: Database, tenant: str, tmp_path: Path) -> None:
    """Copy a second, new source (so no plan exists for it) under ``tenant``."""
    other = tmp_path / "other"
    other.mkdir()
    fresh = parse_url(f"sqlite:///{other / 'lore.db'}")
    populate(fresh, other)
    dbcopy.copy(fresh, target, tenant=tenant)


def lore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith("LORE_")}
    return subprocess.run([sys.executable, "-m", "lore_gateway", *args], capture_output=True,
                          text=True, timeout=300, env={**base, "LORE_CONFIG": os.devnull,
                                                       **(env or {})})


def test_the_db_commands_migrate_copy_and_show_status(
        source: Database, target: Database, tmp_path: Path) -> None:
    migrated = lore("db", "migrate", "--url", _raw_url(target))
    assert migrated.returncode == 0, migrated.stderr
    # The test harness hands out Postgres databases already migrated.
    assert ("migrated from schema version 0" if target.backend == "sqlite"
            else "up to date") in migrated.stdout
    again = lore("db", "migrate", "--url", _raw_url(target))
    assert "up to date" in again.stdout

    copied = lore("db", "copy", "--from", source.url, "--to", _raw_url(target), "--json")
    assert copied.returncode == 0, copied.stderr
    document = json.loads(copied.stdout.splitlines()[-1])
    assert document["ok"] and not document["resumed"]
    assert {t["table"]: t["target"] for t in document["tables"]}["messages"] == 145

    status = lore("db", "status", "--json", env={"LORE_DATABASE_URL": _raw_url(target)})
    assert status.returncode == 0, status.stderr
    facts = json.loads(status.stdout)
    assert facts["rows"]["messages"] == 145 and facts["unfinished_copies"] == []
    assert facts["schema_version"] == facts["latest_version"]
    if target.backend == "postgres":
        assert facts["pgvector"] and "***" not in _raw_url(target)
    table = lore("db", "status", env={"LORE_DATABASE_URL": _raw_url(target)})
    assert "messages\t145" in table.stdout


def test_an_unreachable_database_is_one_line_with_the_fix(tmp_path: Path) -> None:
    gone = lore("db", "status", "--url", "postgresql://lore:secret@127.0.0.1:9/lore")
    assert gone.returncode == 2
    (line,) = gone.stderr.strip().splitlines()
    assert line.startswith("lore: error: the memory database cannot be reached (postgresql://lore:***@")
    assert "secret" not in line and "check that the server runs" in line
    missing = lore("db", "copy", "--from", f"sqlite:///{tmp_path / 'none.db'}", "--to",
                   f"sqlite:///{tmp_path / 'to.db'}")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr


def _raw_url(target: Database) -> str:
    return str(getattr(target, "conninfo", target.url))


def test_doctor_checks_the_postgres_connection_and_pgvector(postgres_url: str) -> None:
    code, checks = _doctor(postgres_url)
    database, vector = checks["database"], checks["pgvector"]
    assert database["status"] == "ok", database
    assert "PostgreSQL 16" in database["detail"] and "schema version" in database["detail"]
    assert vector["status"] == "ok" and vector["detail"].startswith("vector ")
    # The tests' gateways connect as an ordinary role, so the tenant policies bind them.
    assert checks["row security"]["status"] == "ok", checks["row security"]

    code, checks = _doctor("postgresql://lore:secret@127.0.0.1:9/lore")
    database = checks["database"]
    assert code == 1 and database["status"] == "FAIL"
    assert "cannot connect" in database["detail"] and "secret" not in database["detail"]
    assert "LORE_DATABASE_URL" in database["fix"]
    assert checks["pgvector"]["status"] == "skipped"


def _doctor(url: str) -> tuple[int, dict[str, Any]]:
    result = lore("doctor", "--json", env={"LORE_DATABASE_URL": url, "LORE_EMBEDDINGS": "false"})
    assert "Traceback" not in result.stderr
    checks = json.loads(result.stdout)["checks"]
    return result.returncode, {c["name"]: c for c in checks}
