"""Opening the memory database: ``connect(target)`` for either backend, and the
one place that decides how a SQLite file is opened (``connect_sqlite``).

apsw rather than the stdlib ``sqlite3``: this Python's sqlite3 cannot load
extensions, while apsw bundles a current SQLite with FTS5.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import apsw

from lore_gateway.storage.base import Connection, Database

# A reader may briefly find the writer checkpointing; wait rather than fail.
BUSY_TIMEOUT_MS = 5_000
# 64 MiB of page cache per connection (negative = KiB). The store is read-heavy
# during search; the default 2 MiB makes BM25 over a large corpus page-fault bound.
CACHE_KIB = 64 * 1024
# The page cache of a connection that only writes (the storage process's turn
# writer, the embedding process's backlog): every page it writes passes through
# its cache, so at 64 MiB it would keep the last 64 MiB written resident for
# nothing; writes touch an index's right edge and a few interior pages. SQLite's
# own default.
WRITER_CACHE_KIB = 2 * 1024

ConnFactory = Callable[[], Connection]
# A database, or (older call sites, tests) the path of a SQLite file.
Target = Database | Path


def database(target: Target) -> Database:
    if isinstance(target, Database):
        return target
    from lore_gateway.storage.sqlite import SqliteDatabase

    return SqliteDatabase(target)


def connect(target: Target, *, readonly: bool = False) -> Connection:
    """A new connection to ``target`` (either backend); the caller closes it."""
    return database(target).connect(readonly=readonly)


def connect_sqlite(path: Path, *, readonly: bool = False) -> apsw.Connection:
    """Open ``path`` in WAL mode with the pragmas every connection needs.

    ``synchronous=NORMAL`` in WAL mode never corrupts the file on a crash; at worst
    the last few commits before a power loss are lost, which is acceptable for a
    memory store and keeps commits off fsync.
    """
    if readonly:
        flags = apsw.SQLITE_OPEN_READONLY
    else:
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        private_dir(path.parent)
        _create_private(path)
    conn = apsw.Connection(str(path), flags=flags)
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


def conn_factory(target: Target, *, readonly: bool = False) -> ConnFactory:
    """A zero-argument opener, for threads that need their own connection."""
    return partial(connect, database(target), readonly=readonly)


def connect_writer(target: Target) -> Connection:
    """A connection for a process that writes and reads back little: a small page
    cache on SQLite (``WRITER_CACHE_KIB``); on Postgres the same as ``connect``."""
    conn = connect(target)
    if conn.backend == "sqlite":
        conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    return conn


def private_dir(path: Path) -> None:
    """Create ``path`` owner-only (0700): it holds conversation text and logs.

    ``mkdir(parents=True, mode=...)`` applies the mode to the last component only,
    so a data dir created as the parent of ``logs/`` came out 0755; the missing
    parents above ``path`` keep the default mode, ``path`` itself does not.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)


def _create_private(path: Path) -> None:
    """Create the file owner-only before SQLite does: it holds conversation text."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
