"""A real Postgres (16, with pgvector) for the tests, started by the tests themselves.

``LORE_TEST_DATABASE_URL`` points the tests at an existing server (a superuser
URL: the harness creates one database per test). Without it, PyPI's ``pgserver``
wheel starts a private server in a temporary directory on a Unix socket (nothing
listens on TCP). Postgres refuses to run as root; as root (CI), pgserver runs the
server as the unprivileged system user ``pgserver``, which it creates on first use.

Each test gets its own database, cloned from a template that already holds the
migrated schema (``CREATE DATABASE … TEMPLATE``: tens of milliseconds), so tests
never see each other's rows and never pay for the migrations again.

The gateways under test connect as ``GATEWAY_ROLE``, an ordinary role that owns its
databases and their tables, as a deployment's gateway does: a superuser would pass
through row-level security (schema v13), so the tests would never see the wall.
Only the harness itself (creating, cloning, dropping databases; the ``vector``
extension, which needs a superuser) uses the admin URL.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lore_gateway.storage.base import Database

TEST_URL_ENV = "LORE_TEST_DATABASE_URL"
TEMPLATE = "lore_template"
GATEWAY_ROLE = "lore_gateway"


def with_database(url: str, name: str) -> str:
    """``url`` with its database name replaced by ``name``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def as_gateway(url: str) -> str:
    """``url`` logging in as GATEWAY_ROLE (its password is its name)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{GATEWAY_ROLE}:{GATEWAY_ROLE}@{host}"))


class PostgresForTests:
    """One server for the test session; ``fresh_url()`` is a new empty memory database."""

    def __init__(self) -> None:
        self._server: Any = None
        self._dir: Path | None = None
        self._lock = threading.Lock()
        self._count = itertools.count()
        self._template_ready = False
        url = os.environ.get(TEST_URL_ENV)
        if url:
            self.admin_url = url
        else:
            import importlib

            pgserver = importlib.import_module("pgserver")
            # A short path: the server's Unix socket lives in it (108-byte limit).
            self._dir = Path(tempfile.mkdtemp(prefix="lore-pg-"))
            self._server = pgserver.get_server(self._dir / "data", cleanup_mode="stop")
            self.admin_url = self._server.get_uri()
        self._prefix = f"lore_test_{os.getpid()}_"

    def _admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True)

    def _ensure_template(self) -> None:
        from lore_gateway.storage import schema
        from lore_gateway.storage.postgres import PostgresDatabase

        name = f"{self._prefix}{TEMPLATE}"
        with self._admin() as admin:
            admin.execute(f"""DO $$ BEGIN
                CREATE ROLE {GATEWAY_ROLE} LOGIN NOSUPERUSER NOBYPASSRLS
                    PASSWORD '{GATEWAY_ROLE}';
                EXCEPTION WHEN duplicate_object THEN NULL; END $$""")
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.execute(f'CREATE DATABASE "{name}" OWNER {GATEWAY_ROLE}')
        import psycopg

        with psycopg.connect(with_database(self.admin_url, name), autocommit=True) as admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
        database = PostgresDatabase(as_gateway(with_database(self.admin_url, name)),
                                    pool_max=1)
        conn = database.connect()
        try:
            schema.migrate(conn)
        finally:
            conn.close()
            database.close()
        self._template = name
        self._template_ready = True

    def fresh_url(self) -> str:
        """A new database with the current schema, for one test."""
        with self._lock:
            if not self._template_ready:
                self._ensure_template()
            name = f"{self._prefix}{next(self._count)}"
            with self._admin() as admin:
                admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'
                              f" OWNER {GATEWAY_ROLE}")
        return as_gateway(with_database(self.admin_url, name))

    def drop(self, url: str) -> None:
        """Drop a test's database (its connections are closed first)."""
        name = urlsplit(url).path.lstrip("/")
        with self._admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        if self._template_ready:
            self.drop(with_database(self.admin_url, self._template))
            self._template_ready = False
        if self._server is not None:
            self._server.cleanup()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def indexed_ids(database: Database, word: str) -> list[int]:
    """Ids of the messages whose indexed text holds ``word``, on either backend (for
    tests that check the search index follows the table)."""
    from lore_gateway.memory.search.query import phrase
    from lore_gateway.memory.search.textindex import text_index
    from lore_gateway.storage import db

    conn = db.connect(database)
    try:
        found = text_index(conn).newest(conn, "messages", [phrase(word, prefix=False)],
                                        conjunction=False, token=None, limit=100_000)
    finally:
        conn.close()
    return sorted(found)
