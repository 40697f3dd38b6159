"""Which database a setting names: ``LORE_DATABASE_URL`` or the data dir's SQLite file."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from lore_gateway.storage.base import Database

if TYPE_CHECKING:
    from lore_gateway.config import Settings

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")

# One Postgres database object (so one bounded pool) per URL and process.
_SHARED: dict[tuple[str, int], Database] = {}
_LOCK = threading.Lock()


def parse_url(url: str, *, pool_max: int | None = None) -> Database:
    """``sqlite:///path`` (or a plain path) or ``postgresql://…``; a clear error otherwise."""
    if url.startswith(POSTGRES_PREFIXES):
        from lore_gateway.storage.postgres import DEFAULT_POOL_MAX, PostgresDatabase

        return PostgresDatabase(url, pool_max=pool_max or DEFAULT_POOL_MAX)
    from lore_gateway.storage.sqlite import SqliteDatabase

    if url.startswith(SQLITE_PREFIX):
        return SqliteDatabase(Path(url[len(SQLITE_PREFIX) - 1:]))
    if "://" in url:
        raise ValueError(f"unsupported database URL {url.split('://')[0]}://…; use "
                         "postgresql://user:password@host/dbname or sqlite:///path/to/lore.db")
    return SqliteDatabase(Path(url))


def database_for(settings: Settings) -> Database:
    """The database of these settings: Postgres when ``database_url`` is set, else
    ``lore.db`` in the data dir (the embedded default)."""
    if settings.database_url:
        key = (settings.database_url, settings.database_pool_max)
        with _LOCK:
            found = _SHARED.get(key)
            if found is None:
                found = _SHARED[key] = parse_url(settings.database_url,
                                                 pool_max=settings.database_pool_max)
            return found
    from lore_gateway.storage.sqlite import SqliteDatabase

    return SqliteDatabase(settings.db_path)


def close_shared(url: str) -> None:
    """Close the pool of the Postgres database at ``url`` in this process (a test's
    database before it is dropped; a CLI command at exit)."""
    with _LOCK:
        found = [key for key in _SHARED if key[0] == url]
        databases = [_SHARED.pop(key) for key in found]
    for database in databases:
        database.close()
