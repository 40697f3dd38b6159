"""The storage interface: one connection type over two database backends.

Every module that reads or writes memory talks to a :class:`Connection`, never to
apsw or psycopg: SQL is written once with ``?`` placeholders, rows are tuples,
errors are ``storage.errors.Storage*``. Only the few places where the dialects
truly differ (full-text search, vectors, schema DDL) have one module per backend
and pick it from ``conn.backend``. docs/storage.md describes the rules.
"""

from lore_gateway.storage.base import Backend, Connection, Cursor, Database
from lore_gateway.storage.target import database_for, parse_url

__all__ = ["Backend", "Connection", "Cursor", "Database", "database_for", "parse_url"]
