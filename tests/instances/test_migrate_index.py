"""`lore db migrate` on a store made before schema v12: the step that builds the HNSW
vector index says so before it runs (with the vectors it covers and the memory it
builds with, sized to them), and the index is there afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lore_gateway.storage.schema_pg import HNSW_MODEL, PG_MIGRATIONS, hnsw_build_memory_mb
from lore_gateway.testing.postgres import GATEWAY_ROLE, as_gateway, with_database

from .test_db_copy import lore

VECTORS = 300


@pytest.fixture
def v11_url(postgres_server: Any, postgres_url: str) -> Iterator[str]:
    """A memory database at schema v11 holding VECTORS messages with vectors (beside
    ``postgres_url``, which makes the harness create the gateway's role)."""
    import psycopg

    name = f"lore_v11_{id(postgres_server)}"
    admin_url = postgres_server.admin_url
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}" OWNER {GATEWAY_ROLE}')
    with psycopg.connect(with_database(admin_url, name), autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
    url = as_gateway(with_database(admin_url, name))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version(version INTEGER NOT NULL)")
        for step in PG_MIGRATIONS:
            if step.version <= 11:
                conn.execute(step.sql.encode())
                conn.execute("INSERT INTO schema_version VALUES (%s)", (step.version,))
        conn.execute("INSERT INTO turns(id, tenant, project, session, protocol, created_at,"
                     " complete) VALUES (1, 't', 'p', 's', 'test', 0, 1)")
        conn.execute("INSERT INTO messages(id, turn_id, tenant, project, session, seq, role,"
                     " content, tokens, created_at, truncated) SELECT g, 1, 't', 'p', 's', g,"
                     " 'user', 'note ' || g, 2, 0, 0 FROM generate_series(1, %s) g",
                     (VECTORS,))
        conn.execute("INSERT INTO embeddings(message_id, model, vector) SELECT g, %s,"
                     " (SELECT array_agg(random() + 0 * d + 0 * g)::real[]::vector"
                     "  FROM generate_series(1, 384) d) FROM generate_series(1, %s) g",
                     (HNSW_MODEL, VECTORS))
    yield url
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_reports_each_step_and_sizes_the_vector_index_build(v11_url: str) -> None:
    import psycopg

    result = lore("db", "migrate", "--url", v11_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("schema v12:") and f"over {VECTORS:,} vectors with "
               f"{hnsw_build_memory_mb(VECTORS, 4096)} MB" in line for line in lines), lines
    assert any(line.startswith("schema v13:") for line in lines), lines
    assert f"migrated from schema version 11 to {PG_MIGRATIONS[-1].version}" in result.stdout
    with psycopg.connect(v11_url) as conn:
        assert conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname ="
                            " 'embeddings_hnsw'").fetchone() is not None


def test_the_build_memory_is_sized_to_the_vectors_and_capped() -> None:
    assert hnsw_build_memory_mb(0, 4096) == 64  # Postgres's default at least
    assert hnsw_build_memory_mb(1_000_000, 4096) == 2_442  # 2,560 B a vector
    assert hnsw_build_memory_mb(10_000_000, 4096) == 4096  # the cap
