"""Row-level security (schema v13), the second wall of team mode, on a real Postgres.

Turns of two tenants are stored through the real write path; then SQL that
forgot its tenant filter runs through the storage layer inside Alice's tenant
scope and must see, change and create nothing of Bob's. Outside a scope (the
writer, migrations, ``lore db copy``) both are visible.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.search.searcher import Searcher
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db
from lore_gateway.storage.errors import StorageError
from lore_gateway.storage.postgres import PostgresDatabase
from lore_gateway.storage.schema_pg import TENANT_TABLES

ALICE_FACT = "alice keeps the aardvark rollout notes"
BOB_FACT = "bob keeps the aardvark billing secrets"


def _store(tmp_path: Path, url: str) -> Settings:
    settings = Settings(data_dir=tmp_path, embeddings=False, database_url=url)
    memory = Memory.open(settings, embedder=None)
    try:
        for n, (tenant, fact) in enumerate((("alice", ALICE_FACT), ("bob", BOB_FACT))):
            memory.submit_turn(TurnRecord(
                identity=Identity(tenant, "shared-project", f"session-{tenant}"),
                protocol="test", model=None,
                messages=(Message("user", fact), Message("assistant", f"noted, {tenant}")),
                created_at=1.7e9 + n))
        memory.flush(timeout=30)
        memory.write_job(lambda c: c.execute(
            "INSERT INTO knowledge(id, tenant, project, category, title, content, confidence,"
            " source, created_at, updated_at) VALUES ('k-bob', 'bob', 'shared-project', 'fact',"
            " 'billing', ?, 1.0, 'test', 0, 0)", (BOB_FACT,)))
    finally:
        memory.close()
    return settings


def test_a_query_without_its_tenant_filter_sees_only_its_tenant(
        tmp_path: Path, postgres_url: str) -> None:
    settings = _store(tmp_path, postgres_url)
    conn = db.connect(settings.database)
    try:
        role = conn.execute("SELECT rolsuper, rolbypassrls FROM pg_roles"
                            " WHERE rolname = current_user").fetchone()
        assert role == (False, False), "a superuser passes through row-level security"
        everyone = {r[0] for r in conn.execute("SELECT DISTINCT tenant FROM messages")}
        assert everyone == {"alice", "bob"}  # outside a scope: unrestricted

        with conn.tenant_scope("alice"):
            for table in TENANT_TABLES:  # every tenant table, no filter in the SQL
                seen = {r[0] for r in conn.execute(f"SELECT DISTINCT tenant FROM {table}")}
                assert seen <= {"alice"}, f"{table} showed {seen} inside alice's scope"
            assert [r[0] for r in conn.execute(
                "SELECT content FROM messages WHERE content LIKE '%aardvark%'")] == [ALICE_FACT]
            # The full-text index has no policy (schema_pg: its @@ could use no index
            # under one); what it finds is loaded from messages, which has.
            assert conn.execute("SELECT count(*) FROM search_docs s JOIN messages m"
                                " ON m.id = s.message_id").fetchone() == (2,)
            conn.execute("SET enable_seqscan = off")  # only an impossible index scans all
            plan = " ".join(r[0] for r in conn.execute(
                "EXPLAIN SELECT m.content FROM search_docs s JOIN messages m"
                " ON m.id = s.message_id WHERE s.content @@ 'aardvark'::tsquery"))
            conn.execute("RESET enable_seqscan")
            assert "search_docs_content" in plan and "Seq Scan" not in plan, plan
            # Writes: another tenant's rows cannot be changed, removed or created.
            conn.execute("UPDATE messages SET content = 'overwritten' WHERE tenant = 'bob'")
            assert conn.changes() == 0
            conn.execute("DELETE FROM knowledge")
            assert conn.changes() == 0
            with pytest.raises(StorageError, match="row-level security"):
                conn.execute("INSERT INTO sessions(tenant, id, project, first_seen, last_seen,"
                             " turns) VALUES ('bob', 'forged', 'p', 0, 0, 1)")
            # A rolled-back transaction (a rollback reverts settings) keeps the wall.
            conn.begin()
            conn.execute("SELECT 1")
            conn.rollback()
            assert {r[0] for r in conn.execute("SELECT tenant FROM turns")} == {"alice"}
            with pytest.raises(StorageError, match="one tenant per piece of work"), \
                    conn.tenant_scope("bob"):
                pass

        assert {r[0] for r in conn.execute("SELECT DISTINCT tenant FROM messages")} == \
            {"alice", "bob"}  # the scope ended with its block
        assert conn.execute("SELECT content FROM knowledge WHERE id = 'k-bob'").fetchone() \
            == (BOB_FACT,)
        assert conn.execute("SELECT count(*) FROM messages WHERE content = 'overwritten'"
                            ).fetchone() == (0,)
    finally:
        conn.close()


def test_a_pooled_connection_leaves_its_scope_behind(tmp_path: Path,
                                                     postgres_url: str) -> None:
    _store(tmp_path, postgres_url)
    database = PostgresDatabase(postgres_url, pool_max=1)  # every borrow: the same one
    try:
        conn = database.connect()
        with conn.tenant_scope("alice"):
            conn.close()  # handed back mid-scope
        again = database.connect()
        try:
            assert {r[0] for r in again.execute("SELECT DISTINCT tenant FROM messages")} \
                == {"alice", "bob"}
        finally:
            again.close()
    finally:
        database.close()


def test_search_runs_inside_its_tenant_scope(tmp_path: Path, postgres_url: str) -> None:
    settings = _store(tmp_path, postgres_url)
    searcher = Searcher(db.conn_factory(settings.database), None)
    for tenant, fact in (("alice", ALICE_FACT), ("bob", BOB_FACT)):
        hits = searcher.search("aardvark", tenant=tenant, project="shared-project",
                               session=f"session-{tenant}", scope="all").hits
        assert [h.content for h in hits if "aardvark" in h.content] == [fact]


# The serving paths that read and write one tenant's rows on a shared connection
# (the reader, the writer's jobs). A restrictive policy added by the test lets rows
# through only inside a tenant scope, so a path that forgot its scope finds nothing
# and can write nothing; with the normal policy a scoped path still sees only its
# own tenant's rows, here next to another tenant's rows under the same session id.
SCOPED_PATH_TABLES = ("recall_anchors", "knowledge", "knowledge_sessions", "context_sessions")
SHARED_SESSION = "same-session-id"


def _require_scope(url: str) -> None:
    import psycopg

    in_scope = "coalesce(current_setting('lore.tenant', true), '') <> ''"
    with psycopg.connect(url, autocommit=True) as admin:
        for table in SCOPED_PATH_TABLES:
            admin.execute(f"CREATE POLICY only_in_a_scope ON {table} AS RESTRICTIVE"
                          f" USING ({in_scope}) WITH CHECK ({in_scope})")


def _recall(anchor_id: str) -> Any:
    from lore_gateway.memory.store.anchor_store import StoredRecall

    return StoredRecall.from_messages(
        anchor_id=anchor_id, protocol="anthropic", marker=None, call_id=f"call-{anchor_id}",
        arguments="{}", position=1, context_id="ctx", assistant={"role": "assistant"},
        tool_result={"content": anchor_id})


def test_anchor_knowledge_and_context_paths_run_inside_their_tenant_scope(
        tmp_path: Path, postgres_url: str) -> None:
    import asyncio

    from lore_gateway.context import store as cstore
    from lore_gateway.context.planner import SessionState
    from lore_gateway.context.service import ContextService
    from lore_gateway.knowledge.service import KnowledgeService
    from lore_gateway.memory.store import anchor_store
    from lore_gateway.routing import Family

    settings = _store(tmp_path, postgres_url).model_copy(update={"export": False})
    conn = db.connect(settings.database)
    try:  # both tenants' rows, written unscoped as the writer and migrations write
        for tenant, layer in (("alice", 2), ("bob", 3)):
            anchor_store._write_rows(conn, (tenant, SHARED_SESSION), [_recall(f"a-{tenant}")],
                                     [])
            cstore.save(conn, tenant, SHARED_SESSION, SessionState(layer=layer))
        conn.execute(
            "INSERT INTO knowledge(id, tenant, project, category, title, content, confidence,"
            " source, created_at, updated_at) VALUES ('k-alice', 'alice', 'shared-project',"
            " 'fact', 'rollout', ?, 1.0, 'test', 0, 1)", (ALICE_FACT,))
        _require_scope(postgres_url)
        assert conn.execute("SELECT count(*) FROM recall_anchors").fetchone() == (0,)

        # Recall anchors: the session read and the write job.
        loaded = anchor_store._read_session(conn, ("alice", SHARED_SESSION))
        assert set(loaded.entries) == {"a-alice"}
        anchor_store._write(conn, ("alice", SHARED_SESSION), [_recall("a-alice-2")], [])
        assert set(anchor_store._read_session(conn, ("alice", SHARED_SESSION)).entries) == \
            {"a-alice", "a-alice-2"}
    finally:
        conn.close()

    memory = Memory.open(settings, embedder=None)
    try:
        # Context state: the load on a session's first request, the persisted save.
        context = ContextService(settings, memory)
        assert asyncio.run(context._state(("alice", SHARED_SESSION))).layer == 2
        assert asyncio.run(context._state(("bob", SHARED_SESSION))).layer == 3
        context._persist(("alice", SHARED_SESSION), SessionState(layer=4))
        memory.write_job(lambda c: None)  # behind the queued save
        # Knowledge: the block a session starts with (project version, session row, entries).
        knowledge = KnowledgeService(settings, memory)
        state = knowledge._open(Identity("alice", "shared-project", SHARED_SESSION),
                                Family.ANTHROPIC, underway=False)
        assert "rollout" in state.block and "billing" not in state.block, state.block
        knowledge._refresh(Identity("alice", "shared-project", SHARED_SESSION), state)
        assert knowledge._project_version(Identity("alice", "shared-project", "x")) == 1.0
        assert knowledge._project_version(Identity("bob", "shared-project", "x")) == 0.0
    finally:
        memory.close()

    conn = db.connect(settings.database)
    try:
        with conn.tenant_scope("alice"):
            assert cstore.load(conn, "alice", SHARED_SESSION).layer == 4  # type: ignore[union-attr]
            assert conn.execute("SELECT count(*) FROM knowledge_sessions").fetchone() == (1,)
        with conn.tenant_scope("bob"):
            assert cstore.load(conn, "bob", SHARED_SESSION).layer == 3  # type: ignore[union-attr]
            assert conn.execute("SELECT count(*) FROM knowledge_sessions").fetchone() == (0,)
    finally:
        conn.close()
