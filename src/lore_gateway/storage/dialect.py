"""SQL fragments that are spelled differently on the two backends.

Most SQL is written once in the subset both understand (``ON CONFLICT … DO
UPDATE/NOTHING``, ``RETURNING``, ``coalesce``, ``CASE`` instead of two-argument
``min``/``max``); the few expressions that have no common spelling live here.
"""

from __future__ import annotations

from lore_gateway.storage.base import Connection


def json_field(conn: Connection, column: str, key: str) -> str:
    """The JSON member ``key`` of a text ``column`` (NULL when absent)."""
    if not key.isidentifier():
        raise ValueError(f"not a plain JSON key: {key!r}")
    if conn.backend == "postgres":
        return f"({column}::jsonb -> '{key}')"
    return f"json_extract({column}, '$.{key}')"


def no_index(conn: Connection, column: str) -> str:
    """``column`` written so SQLite's planner does not pick its index (unary ``+``);
    Postgres has no such hint and needs none here."""
    return column if conn.backend == "postgres" else f"+{column}"


def table_exists(conn: Connection, name: str) -> bool:
    """Whether the table ``name`` exists (an older schema may lack it)."""
    if conn.backend == "postgres":
        row = conn.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()
        return bool(row and row[0])
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None
