"""What every backend provides: a database (where), connections (how) and cursors (rows).

The connection is deliberately small and close to the DB-API subset the code
already used with apsw, so a call site changes its type annotation and nothing
else unless its SQL is not portable:

- ``execute(sql, params)`` with ``?`` placeholders; the cursor yields tuples.
- ``insert(sql, params)``: an ``INSERT`` that returns the new row's ``id``
  (``RETURNING id`` on both backends; there is no ``last_insert_rowid``).
- ``with conn:`` is a savepoint inside a transaction and a transaction outside one
  (apsw's semantics, kept on Postgres with explicit ``SAVEPOINT``).
- ``begin()`` / ``commit()`` / ``rollback()`` for the writer's batches;
  ``begin(immediate=True)`` takes SQLite's write lock up front.
- ``changes()``: rows touched by the last ``execute``.
- ``script(sql)``: several statements without parameters (migrations).
- ``with conn.tenant_scope(tenant):`` declares that the work inside belongs to one
  tenant; on Postgres row-level security (schema v13) then hides and refuses every
  other tenant's rows, whatever the SQL says. SQLite has no such wall (a no-op).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import Any, Literal, TypeVar

Backend = Literal["sqlite", "postgres"]
Params = Sequence[Any]


class Cursor(ABC):
    """The rows of one statement, as tuples."""

    @abstractmethod
    def fetchone(self) -> tuple[Any, ...] | None: ...

    @abstractmethod
    def fetchall(self) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def __iter__(self) -> Iterator[tuple[Any, ...]]: ...


class Connection(ABC):
    """One connection to the memory database (not thread-safe: one thread owns it)."""

    backend: Backend

    @abstractmethod
    def execute(self, sql: str, params: Params = ()) -> Cursor: ...

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Params]) -> None: ...

    @abstractmethod
    def script(self, sql: str) -> None:
        """Run several ``;``-separated statements that take no parameters."""

    def insert(self, sql: str, params: Params = ()) -> int:
        """Run an ``INSERT`` into a table with an ``id`` key; the new row's id."""
        row = self.execute(sql + " RETURNING id", params).fetchone()
        if row is None:
            raise RuntimeError("INSERT … RETURNING id returned no row")
        return int(row[0])

    @abstractmethod
    def changes(self) -> int:
        """Rows inserted, updated or deleted by the last ``execute``."""

    @property
    @abstractmethod
    def in_transaction(self) -> bool: ...

    @abstractmethod
    def begin(self, *, immediate: bool = True) -> None:
        """Start a transaction; ``immediate`` takes SQLite's write lock now."""

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def lock_schema(self) -> None:
        """Inside a transaction: hold the lock that serialises migrations (every
        process and instance on this database waits here)."""

    def tenant_scope(self, tenant: str) -> AbstractContextManager[None]:
        """Inside: only ``tenant``'s rows are visible or writable (Postgres
        row-level security; nothing on SQLite, where every query's own tenant
        filter is the only wall)."""
        return nullcontext()

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def __enter__(self) -> Connection: ...

    @abstractmethod
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class Database(ABC):
    """Where memory lives: a SQLite file or a Postgres server. Picklable (only its
    address), so the search and embedding processes open their own connections."""

    backend: Backend

    @property
    @abstractmethod
    def url(self) -> str:
        """``sqlite:///abs/path`` or the Postgres URL without its password."""

    @property
    @abstractmethod
    def address(self) -> str:
        """The full URL (password included) for ``target.parse_url`` in a child
        process: a child opens its own connections, never the parent's pool."""

    @abstractmethod
    def connect(self, *, readonly: bool = False) -> Connection:
        """A new connection owned by the caller (close it)."""

    def exists(self) -> bool:
        """Whether there is a database here yet (a SQLite file that was never made is not)."""
        return True

    def close(self) -> None:
        """Release what the database object holds itself (a connection pool);
        connections handed out are their owners' to close. A SQLite file holds
        nothing of its own."""
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._init_args())

    @abstractmethod
    def _init_args(self) -> tuple[Any, ...]: ...

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Database) and self._init_args() == other._init_args()

    def __hash__(self) -> int:
        return hash(self._init_args())


T = TypeVar("T")


def in_tenant(tenant: str, run: Callable[[Connection], T]) -> Callable[[Connection], T]:
    """``run`` inside ``tenant``'s scope (``Connection.tenant_scope``), for work of one
    tenant handed to a shared connection (the reader, the writer's jobs): on Postgres
    row-level security keeps it to that tenant's rows whatever its SQL says."""
    def scoped(conn: Connection) -> T:
        with conn.tenant_scope(tenant):
            return run(conn)
    return scoped
