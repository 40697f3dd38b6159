"""The embedded backend: one SQLite file through apsw (storage/db.py opens it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import apsw

from lore_gateway.storage.base import Connection, Cursor, Database, Params
from lore_gateway.storage.errors import StorageBusy, StorageConstraint, StorageError

T = TypeVar("T")


def mapped(exc: apsw.Error) -> StorageError:
    """apsw's exception as ours (the caller raises it ``from exc``)."""
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return StorageBusy(f"the memory database is locked by another writer ({exc})")
    if isinstance(exc, apsw.ConstraintError):
        return StorageConstraint(str(exc))
    return StorageError(f"{type(exc).__name__}: {exc}")


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except apsw.Error as exc:
        raise mapped(exc) from exc


class SqliteCursor(Cursor):
    __slots__ = ("_cursor",)

    def __init__(self, cursor: apsw.Cursor) -> None:
        self._cursor = cursor

    def fetchone(self) -> tuple[Any, ...] | None:
        row = _call(self._cursor.fetchone)
        return None if row is None else tuple(row)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in _call(self._cursor.fetchall)]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        it = iter(self._cursor)
        while True:
            try:
                row = next(it)
            except StopIteration:
                return
            except apsw.Error as exc:
                raise mapped(exc) from exc
            yield tuple(row)


class SqliteConnection(Connection):
    """apsw underneath; ``raw`` is the apsw connection for SQLite-only modules."""

    backend = "sqlite"

    def __init__(self, raw: apsw.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        return SqliteCursor(_call(lambda: self.raw.execute(sql, tuple(params))))

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        _call(lambda: self.raw.executemany(sql, [tuple(r) for r in rows]))

    def script(self, sql: str) -> None:
        _call(lambda: self.raw.execute(sql))

    def changes(self) -> int:
        return int(self.raw.changes())

    @property
    def in_transaction(self) -> bool:
        return not self.raw.getautocommit()

    def begin(self, *, immediate: bool = True) -> None:
        self.script("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def commit(self) -> None:
        self.script("COMMIT")

    def rollback(self) -> None:
        self.script("ROLLBACK")

    def lock_schema(self) -> None:
        """``begin(immediate=True)`` already holds the one write lock of the file."""

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Connection:
        _call(self.raw.__enter__)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _call(lambda: self.raw.__exit__(exc_type, exc, tb))


class SqliteDatabase(Database):
    backend = "sqlite"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).expanduser().resolve()

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    @property
    def address(self) -> str:
        return self.url

    def connect(self, *, readonly: bool = False) -> Connection:
        from lore_gateway.storage.db import connect_sqlite

        return SqliteConnection(connect_sqlite(self.path, readonly=readonly))

    def exists(self) -> bool:
        return self.path.exists()

    def _init_args(self) -> tuple[Any, ...]:
        return (str(self.path),)

    def __repr__(self) -> str:
        return f"SqliteDatabase({str(self.path)!r})"
