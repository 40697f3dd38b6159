"""The "personal tenant" migration: an older database's credential tenants become one memory.

Before it, a tenant was a salted hash of the provider credential (``t-…``) and
imports went to ``anonymous``, so one user's memory was split in several. The
test builds such a database with the migrations that precede this step, writes
through the old write path, then opens it as the gateway would.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.turn_rows import write_turn
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db, schema

OLD_TENANTS = ("t-0123456789abcdef01234567", "t-fedcba9876543210fedcba98", "anonymous")


def _older_database(path: Path) -> None:
    """A database at the version just before the tenancy step, with three tenants."""
    step = next(i for i, m in enumerate(schema.MIGRATIONS) if m.sql is schema._V6_TENANCY)
    conn = db.connect(path)
    conn.execute("CREATE TABLE schema_version(version INTEGER NOT NULL)")
    for migration in schema.MIGRATIONS[:step]:
        conn.execute(migration.sql)
        conn.execute("INSERT INTO schema_version VALUES (?)", (migration.version,))
    texts = {OLD_TENANTS[0]: "codex said the cache key is the tenant salt",
             OLD_TENANTS[1]: "claude said the cache key lives in redis",
             OLD_TENANTS[2]: "an imported note about the cache key rotation"}
    with conn:
        for n, (tenant, text) in enumerate(texts.items()):
            # Two credentials wrote to the same session id (a fingerprint session).
            session = "fp-shared" if n < 2 else "imported-1"
            write_turn(conn, TurnRecord(Identity(tenant, "/repo", session), "chat", "m",
                                        (Message("user", text),), 1.7e9 + n), 1 << 20)
        conn.execute(
            "INSERT INTO recall_anchors VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (OLD_TENANTS[0], "fp-shared", "a1", "responses", None, "call_1", "{}", 3, "c1",
             "{}", "{}", time.time()))
    conn.close()


@pytest.mark.sqlite_only  # upgrades an older SQLite file
def test_credential_tenants_merge_into_the_personal_tenant(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, embeddings=False)
    _older_database(settings.db_path)

    memory = Memory.open(settings, embedder=None)
    try:
        assert [t.tenant for t in memory.tenants()] == [PERSONAL]
        sessions = {s.session: s for s in memory.sessions(PERSONAL)}
        assert set(sessions) == {"fp-shared", "imported-1"}
        assert (sessions["fp-shared"].turns, sessions["fp-shared"].messages) == (2, 2)
        assert sessions["fp-shared"].first_seen == 1.7e9
        hits = memory.search_sync("cache key", identity=Identity(PERSONAL, "/repo", "x")).hits
        assert len(hits) == 3  # every old tenant's turn, found from the one memory
        conn = db.connect(settings.database)
        try:
            for table in ("turns", "messages", "sessions", "recall_anchors", "search_scopes"):
                left = conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE tenant != ?", (PERSONAL,)).fetchone()
                assert left == (0,), table
            assert conn.execute("SELECT COUNT(*) FROM recall_anchors").fetchone() == (1,)
        finally:
            conn.close()
        # New turns of the merged session land beside the old ones.
        memory.submit_turn(TurnRecord(Identity(PERSONAL, "/repo", "fp-shared"), "chat", "m",
                                      (Message("user", "the cache key moved again"),),
                                      time.time()))
        memory.flush(10)
        assert memory.sessions(PERSONAL)[0].turns == 3
    finally:
        memory.close()
