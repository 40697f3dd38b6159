"""Why the store could not answer: typed, so callers (the recall side among them)
can name a failure category instead of guessing from a message. The backends
raise the ``Storage*`` errors in place of their drivers' own."""

from __future__ import annotations


class MemoryUnavailable(Exception):
    """Memory cannot answer right now (its search process is down or overloaded).
    The request goes on without it; the message says what happened."""


class SearchTimeout(MemoryUnavailable):
    """A search did not finish within the search timeout."""


class StorageError(Exception):
    """A database statement failed. Raised by both backends (``lore_gateway.storage``)
    in place of apsw's or psycopg's own exceptions, so callers need not know which
    backend they run on; ``__cause__`` holds the driver's exception."""


class StorageBusy(StorageError):
    """Another writer holds the lock (SQLite) or a lock wait timed out (Postgres);
    retrying later can succeed."""


class StorageConstraint(StorageError):
    """A uniqueness, foreign-key or NOT NULL constraint refused the statement."""


class StorageUnavailable(StorageError, MemoryUnavailable):
    """The database cannot be reached (Postgres down, connection lost, pool exhausted).
    Requests that need memory get a clear error; plain forwarding goes on."""
