"""The shared backend: Postgres (with pgvector) through psycopg 3 and a bounded pool.

Connections run in autocommit mode; transactions are explicit (``begin`` or
``with conn:``), as on SQLite, so a statement outside a transaction commits at
once on both backends. SQL arrives with ``?`` placeholders and is translated once
per distinct statement (``?`` → ``%s`` outside string literals, ``%`` → ``%%``).

A lost server (a restart, a failover, a cut network) must cost a clear error, never
a hung request or a connection that stays broken after the server is back:

* a connection the server dropped is swapped for a fresh one from the pool at its
  next statement, unless a transaction was open on it (its statements fail until
  the caller rolls back: its work is gone), so long-held connections (the writer's,
  the reader's, a search thread's) heal by themselves;
* a drop that happened while a connection sat idle is noticed before its next
  statement (``_notice_drop``: one poll of its socket), so that statement runs on
  a fresh connection instead of failing once after the server is back;
* a connection a failed call left in the middle of a command (libpq still waiting
  for a result, which would answer every later statement with "another command is
  already in progress") is closed at once, so it is swapped like a dropped one;
* TCP keepalives (``KEEPALIVE_PARAMS``, unless the URL sets its own) find a server
  that vanished without a reset within about a minute, instead of a statement
  waiting for its answer for hours; ``idle_in_transaction_session_timeout`` lets
  the server end a transaction whose gateway went silent, which would otherwise
  hold its locks (the search-terms lock every writer takes) indefinitely;
* a borrow that finds no free connection within ``FIRST_WAIT_S`` checks the
  server directly (``PROBE_TIMEOUT_S``); when it is unreachable the borrow fails
  at once with the reason, and for ``DOWN_RECHECK_S`` so does every other borrow,
  without waiting on the pool; a reachable server means the pool is exhausted,
  and the borrow waits out ``POOL_TIMEOUT_S``. The probe is one connection beyond
  the pool's bound, one at a time.
"""

from __future__ import annotations

import functools
import logging
import re
import select
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from lore_gateway.storage.base import Connection, Cursor, Database, Params
from lore_gateway.storage.errors import (
    StorageBusy,
    StorageConstraint,
    StorageError,
    StorageUnavailable,
)

T = TypeVar("T")

# Connections one process may hold (writer, reader, search threads, workers); a
# request that finds them all busy waits POOL_TIMEOUT_S and then fails clearly.
DEFAULT_POOL_MAX = 16
POOL_TIMEOUT_S = 10.0
# Distinct SQL texts whose placeholder translation is cached (the code has a few
# hundred; ``IN (?,?,…)`` lists of many lengths add some).
TRANSLATED_STATEMENTS = 4096
# The key of the advisory lock that serialises migrations across instances.
SCHEMA_LOCK_KEY = 0x6C6F7265  # "lore"
# A borrow waits this long for a free connection before it checks whether the
# server answers at all (a healthy pool hands one out in well under a millisecond).
FIRST_WAIT_S = 2.0
# The direct check: long enough for a loaded server to accept, short enough that a
# request needing memory learns the database is gone within seconds.
PROBE_TIMEOUT_S = 2
# After a failed check, borrows fail at once for this long, then check again.
DOWN_RECHECK_S = 1.0
# libpq's TCP keepalives (seconds; ignored on a Unix socket): a silent peer is given
# up after idle + interval × count, about a minute, not the kernel's two hours.
KEEPALIVE_PARAMS = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                    "keepalives_count": 3}
# The server ends a transaction left idle this long (a gateway's own transactions
# idle for milliseconds between statements; ``lore db copy`` for seconds).
IDLE_IN_TRANSACTION_TIMEOUT = "5min"

log = logging.getLogger(__name__)
# The pool logs every failed reconnection attempt; an outage is reported once, here.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=TRANSLATED_STATEMENTS)
def translate(sql: str) -> tuple[str, bool]:
    """SQLite's placeholders in psycopg's terms, and whether they are numbered.

    ``?`` becomes ``%s``; when the statement numbers any (``?2``, reused as in
    ``(?1 IS NULL OR tenant = ?1)``), every placeholder becomes ``%(pN)s``, with a
    plain ``?`` numbered one past the highest so far, as SQLite does (such
    statements are bound client-side: ``PgConnection.execute``). A literal
    ``%`` is doubled; string literals and quoted identifiers are copied as they are.
    """
    out: list[str] = []
    quote: str | None = None
    numbered = False
    highest = 0
    i = 0
    while i < len(sql):
        ch = sql[i]
        i += 1
        if quote is not None:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            j = i
            while j < len(sql) and sql[j].isdigit():
                j += 1
            number = int(sql[i:j]) if j > i else highest + 1
            numbered = numbered or j > i
            highest = max(highest, number)
            out.append(f"%(p{number})s")
            i = j
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    text = "".join(out)
    if not numbered:
        text = re.sub(r"%\(p\d+\)s", "%s", text)
    return text, numbered


def _bind(numbered: bool, params: Params) -> Any:
    return {f"p{i}": v for i, v in enumerate(params, 1)} if numbered else tuple(params)


def mapped(exc: Exception) -> StorageError:
    """psycopg's (or the pool's) exception as ours (raise it ``from exc``)."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return StorageUnavailable(f"no free database connection within {POOL_TIMEOUT_S:g} s "
                                  "(raise LORE_DATABASE_POOL_MAX or look for stuck queries)")
    if isinstance(exc, pgerrors.LockNotAvailable | pgerrors.DeadlockDetected
                  | pgerrors.SerializationFailure):
        return StorageBusy(f"the memory database is busy ({exc})")
    if isinstance(exc, psycopg.IntegrityError):
        return StorageConstraint(str(exc))
    if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolClosed):
        return StorageUnavailable(f"the memory database cannot be reached: {exc}")
    return StorageError(f"{type(exc).__name__}: {exc}")


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
        raise mapped(exc) from exc


class PgCursor(Cursor):
    __slots__ = ("_cursor",)

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._cursor.description is None:
            return None
        return _call(self._cursor.fetchone)

    def fetchall(self) -> list[tuple[Any, ...]]:
        if self._cursor.description is None:
            return []
        return _call(self._cursor.fetchall)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


class PgConnection(Connection):
    """A pooled psycopg connection; ``close`` hands it back to the pool."""

    backend = "postgres"

    def __init__(self, raw: psycopg.Connection[Any],
                 release: Callable[[psycopg.Connection[Any]], None],
                 borrow: Callable[[], psycopg.Connection[Any]] | None = None) -> None:
        self.raw = raw
        self._release = release
        self._borrow = borrow
        self._rowcount = 0
        self._savepoints: list[str | None] = []
        self._begun = False  # a transaction opened with begin()
        self._tenant: str | None = None  # inside tenant_scope

    def _live(self) -> psycopg.Connection[Any]:
        """The raw connection; one the server dropped is replaced from the pool
        first, unless a transaction was open on it (module docstring)."""
        if self._borrow is not None and not self._open_transaction and not self.raw.broken:
            _notice_drop(self.raw)
        if self.raw.broken and self._borrow is not None and not self._open_transaction:
            fresh = self._borrow()  # raises StorageUnavailable while the server is gone
            broken, self.raw = self.raw, fresh
            self._release(broken)  # the pool discards a broken connection
            if self._tenant is not None:
                self._set_tenant()  # the wall goes with the work, onto the new connection
        return self.raw

    # --- tenant scope (row-level security, schema v13) ------------------------------

    @contextmanager
    def tenant_scope(self, tenant: str) -> Iterator[None]:
        """``lore.tenant`` names ``tenant`` for this session while inside (a
        session setting, not ``SET LOCAL``, so transactions inside keep their own
        boundaries); cleared on the way out, after any rollback re-applied (a
        rollback reverts settings), and cleared again when the pool takes the
        connection back (``_reset``), so it never reaches the next borrower."""
        if self._tenant is not None:
            if self._tenant != tenant:
                raise StorageError(f"a {tenant!r} scope inside the {self._tenant!r} one: "
                                   "one tenant per piece of work")
            yield
            return
        self._tenant = tenant
        try:
            self._set_tenant()
            yield
        finally:
            self._tenant = None
            if not self.raw.broken and self._release is not _closed:
                self._set_tenant()  # (a closed one was cleared by the pool's _reset)

    @property
    def _open_transaction(self) -> bool:
        """A transaction this connection opened and nobody ended yet (the server
        may have ended it already, by dropping the connection)."""
        return self._begun or bool(self._savepoints)

    def _call(self, raw: psycopg.Connection[Any], fn: Callable[[], T]) -> T:
        """``fn()`` on ``raw``, psycopg's errors as ours; a connection the failure
        left in the middle of a command is closed (module docstring)."""
        try:
            return fn()
        except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed) as exc:
            if not raw.closed and raw.pgconn.transaction_status == TransactionStatus.ACTIVE:
                log.warning("memory: a database connection was left in the middle of a "
                            "command (%s); closing it, the next statement takes a new one",
                            " ".join(str(exc).split())[:200])
                raw.pgconn.finish()  # now ``broken``: _live swaps it, the pool drops it
            raise mapped(exc) from exc

    def _set_tenant(self) -> None:
        # Through _live: a connection the server dropped during an outage is swapped
        # here too, or a search (whose first statement this is) would never heal.
        raw = self._live()
        self._call(raw, lambda: raw.execute("SELECT set_config('lore.tenant', %s, false)",
                                            (self._tenant or "",)))

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        text, numbered = translate(sql)
        raw = self._live()
        if numbered:
            # ``(?1 IS NULL OR tenant = ?1)``: Postgres types a parameter at its first
            # use, and ``$1 IS NULL`` says nothing; bound client-side, the value is
            # a typed literal in the statement instead.
            cursor: psycopg.Cursor[Any] = psycopg.ClientCursor(raw)
            self._call(raw, lambda: cursor.execute(text, _bind(numbered, params)))
        else:
            cursor = self._call(raw, lambda: raw.execute(text, tuple(params)))
        self._rowcount = max(cursor.rowcount, 0)
        return PgCursor(cursor)

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        raw = self._live()

        def run() -> None:
            with raw.cursor() as cur:
                text, numbered = translate(sql)
                cur.executemany(text, [_bind(numbered, r) for r in rows])
                self._rowcount = max(cur.rowcount, 0)
        self._call(raw, run)

    def script(self, sql: str) -> None:
        # Without parameters psycopg sends the text as one simple query, so several
        # statements (and ``$$`` function bodies) go through unparsed.
        raw = self._live()
        self._call(raw, lambda: raw.execute(sql.encode()))

    def changes(self) -> int:
        return self._rowcount

    @property
    def in_transaction(self) -> bool:
        # One this connection opened counts until it is rolled back, even when the
        # server already did so by dropping the connection: the caller's rollback
        # is what lets the next statement take a fresh connection (_live).
        if self._open_transaction:
            return True
        return not self.raw.broken and \
            self.raw.info.transaction_status != TransactionStatus.IDLE

    def begin(self, *, immediate: bool = True) -> None:
        self.script("BEGIN")
        self._begun = True

    def commit(self) -> None:
        self._begun = False
        self.script("COMMIT")

    def rollback(self) -> None:
        self._begun = False
        if self.raw.broken:
            return  # nothing to roll back: the server did when the connection died
        self.script("ROLLBACK")
        self._set_tenant()

    def lock_schema(self) -> None:
        self.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK_KEY,))

    def close(self) -> None:
        raw, self._release = self._release, _closed
        raw(self.raw)

    def __enter__(self) -> Connection:
        if self.in_transaction:
            name = f"lore_sp{len(self._savepoints)}"
            self.script(f"SAVEPOINT {name}")
            self._savepoints.append(name)
        else:
            self.begin()
            self._savepoints.append(None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        name = self._savepoints.pop()
        if name is None:
            self.commit() if exc_type is None else self.rollback()
        elif exc_type is None:
            self.script(f"RELEASE SAVEPOINT {name}")
        elif not self.raw.broken:
            self.script(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
            self._set_tenant()


def _notice_drop(raw: psycopg.Connection[Any]) -> None:
    """Let libpq see a drop that happened while ``raw`` sat idle (a reset or an end
    of stream waiting on its socket), so it counts as ``broken`` before a statement
    is sent on it, instead of that statement failing after the server is back.

    An idle connection has nothing to read; if its socket is readable, reading it
    either fails (the drop: libpq marks the connection bad) or buffers a message
    psycopg will deliver anyway. One ``poll`` of the socket without waiting."""
    pgconn = raw.pgconn
    if pgconn.transaction_status != TransactionStatus.IDLE or not hasattr(select, "poll"):
        return
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN)
        if poller.poll(0):
            pgconn.consume_input()
    except psycopg.OperationalError:
        pass  # the drop, now known to libpq: ``raw.broken``


def _closed(raw: psycopg.Connection[Any]) -> None:
    """A closed connection's release: closing twice does nothing."""


def _configure(raw: psycopg.Connection[Any]) -> None:
    """A new pooled connection's session settings (module docstring)."""
    raw.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'")


def _reset(raw: psycopg.Connection[Any]) -> None:
    """A returned connection leaves no tenant scope behind (row-level security)."""
    raw.execute("SELECT set_config('lore.tenant', '', false)")


class PostgresDatabase(Database):
    """A Postgres server; one bounded connection pool per process, opened lazily."""

    backend = "postgres"

    def __init__(self, conninfo: str, *, pool_max: int = DEFAULT_POOL_MAX) -> None:
        self.conninfo = conninfo
        self.pool_max = pool_max
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._lock = threading.Lock()
        self._probe_lock = threading.Lock()
        # Why the server was last found unreachable, and when (monotonic).
        self._down: tuple[str, float] | None = None
        # Until the first connection, a borrow checks the server first: a wrong
        # URL or a stopped server fails at once, not after FIRST_WAIT_S.
        self._reached = False

    @property
    def url(self) -> str:
        parts = urlsplit(self.conninfo)
        if parts.password is None:
            return self.conninfo
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def address(self) -> str:
        return self.conninfo

    def pool(self) -> psycopg_pool.ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                given = conninfo_to_dict(self.conninfo)
                keepalives = {k: v for k, v in KEEPALIVE_PARAMS.items() if k not in given}
                self._pool = psycopg_pool.ConnectionPool(
                    self.conninfo, min_size=0, max_size=self.pool_max,
                    kwargs={"autocommit": True, **keepalives}, timeout=POOL_TIMEOUT_S,
                    open=True, name="lore", configure=_configure, reset=_reset)
            return self._pool

    def connect(self, *, readonly: bool = False) -> Connection:
        raw = self._borrow()
        return PgConnection(raw, self.pool().putconn, self._borrow)

    def _borrow(self) -> psycopg.Connection[Any]:
        """A connection from the pool, or a clear ``StorageUnavailable`` soon
        when the server does not answer (module docstring)."""
        down = self._down
        if down is not None:
            if time.monotonic() - down[1] < DOWN_RECHECK_S:
                raise StorageUnavailable(down[0])
            self._check()
        elif not self._reached:
            self._check()
        pool = self.pool()
        try:
            raw: psycopg.Connection[Any] = pool.getconn(timeout=FIRST_WAIT_S)
        except psycopg_pool.PoolTimeout:
            self._check()
            raw = _call(lambda: pool.getconn(timeout=POOL_TIMEOUT_S - FIRST_WAIT_S))
        except (psycopg.Error, psycopg_pool.PoolClosed) as exc:
            raise mapped(exc) from exc
        self._reached = True
        return raw

    def _check(self) -> None:
        """Connect directly; raise ``StorageUnavailable`` with the reason if that
        fails (and remember it), else forget an earlier failure."""
        with self._probe_lock:
            down = self._down
            if down is not None and time.monotonic() - down[1] < DOWN_RECHECK_S:
                raise StorageUnavailable(down[0])
            try:
                psycopg.connect(self.conninfo, connect_timeout=PROBE_TIMEOUT_S).close()
            except psycopg.Error as exc:
                reason = " ".join(str(exc).split())[:300]
                message = f"the memory database cannot be reached ({self.url}): {reason}"
                if self._down is None:
                    log.error("memory: %s; requests that need memory fail until it is back, "
                              "plain forwarding goes on", message)
                self._down = (message, time.monotonic())
                raise StorageUnavailable(message) from exc
            if self._down is not None:
                log.warning("memory: the database %s answers again", self.url)
            self._down = None

    def close(self) -> None:
        """Close the pool (idle connections go now; borrowed ones when returned)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    def _init_args(self) -> tuple[Any, ...]:
        return (self.conninfo,)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.conninfo,), {"pool_max": self.pool_max})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pool_max = state["pool_max"]

    def __repr__(self) -> str:
        return f"PostgresDatabase({self.url!r})"
