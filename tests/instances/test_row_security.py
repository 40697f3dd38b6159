"""Row-level security (schema v13), the second wall of team mode, on a real Postgres.

Turns of two tenants are stored through the real write path; then SQL that
forgot its tenant filter runs through the storage layer inside Alice's tenant
scope and must see, change and create nothing of Bob's. Outside a scope (the
writer, migrations, ``lore db copy``) both are visible.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory import db
from lore_gateway.memory.errors import StorageError
from lore_gateway.memory.records import Identity, TurnRecord
from lore_gateway.memory.schema_pg import TENANT_TABLES
from lore_gateway.memory.search import Searcher
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message
from lore_gateway.storage.postgres import PostgresDatabase

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
