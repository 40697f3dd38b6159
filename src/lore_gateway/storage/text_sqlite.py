"""FTS5: ``messages_fts`` and ``context_fts`` with their scope column (schema v4, v7)."""

from __future__ import annotations

from collections.abc import Sequence

from lore_gateway.memory.search.textindex import Table
from lore_gateway.storage.base import Connection

_TABLES = {"messages": "messages_fts", "context": "context_fts"}


def _expression(phrases: Sequence[str], conjunction: bool, token: object | None) -> str:
    expression = "{content}: (" + (" AND " if conjunction else " OR ").join(phrases) + ")"
    return expression if token is None else f"{{scope}}: {token} AND {expression}"


class Fts5Index:
    tenant_column = "+tenant"

    def scope_token(self, conn: Connection, kind: str, tenant: str, name: str) -> object | None:
        row = conn.execute("SELECT id FROM search_scopes WHERE kind = ? AND tenant = ?"
                           " AND name = ?", (kind, tenant, name)).fetchone()
        return None if row is None else f"{kind}{int(row[0])}"

    def _count(self, conn: Connection, expression: str, cap: int) -> int:
        got = conn.execute(
            "SELECT count(*) FROM (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?"
            " LIMIT ?)", (expression, cap + 1)).fetchone()
        return int(got[0]) if got is not None else 0

    def count_scope(self, conn: Connection, token: object, cap: int) -> int:
        return self._count(conn, f"{{scope}}: {token}", cap)

    def count_phrase(self, conn: Connection, phrase: str, cap: int) -> int:
        return self._count(conn, f"{{content}}: {phrase}", cap)

    def newest(self, conn: Connection, table: Table, phrases: Sequence[str], *,
               conjunction: bool, token: object | None, limit: int,
               offset: int = 0) -> list[int]:
        fts = _TABLES[table]
        return [int(r[0]) for r in conn.execute(
            f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? ORDER BY rowid DESC"
            f" LIMIT {int(limit)} OFFSET {int(offset)}",
            (_expression(phrases, conjunction, token),))]

    def bm25(self, conn: Connection, table: Table, phrases: Sequence[str], *,
             conjunction: bool, token: object | None, floor: int,
             limit: int) -> list[tuple[int, float]]:
        fts = _TABLES[table]
        # BM25 with weight 0 for the scope column, sorted by SQLite, not by FTS5's
        # ``ORDER BY rank``: that sorts through a second cursor, which sets the
        # query's phrases up again (a prefix's doclists merged twice). The same
        # rows, scores and order (FTS5 too puts ties in rowid order) in 0.6-0.75
        # of the time (docs/search.md, "Latency").
        return [(int(r[0]), -float(r[1])) for r in conn.execute(
            f"SELECT rowid, bm25({fts}, 1.0, 0.0) AS score FROM {fts} WHERE {fts} MATCH ?"
            f" AND rowid >= ? ORDER BY score, rowid LIMIT {int(limit)}",
            (_expression(phrases, conjunction, token), floor))]

    def matching(self, conn: Connection, table: Table, phrases: Sequence[str],
                 ids: Sequence[int]) -> list[int]:
        if not ids or not phrases:
            return []
        fts = _TABLES[table]
        marks = ",".join("?" * len(ids))
        expression = "{content}: (" + " OR ".join(phrases) + ")"
        return [int(r[0]) for r in conn.execute(
            f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? AND rowid IN ({marks})",
            (expression, *ids))]

    def matching_each(self, conn: Connection, table: Table, phrases: Sequence[str],
                      ids: Sequence[int]) -> list[set[int]]:
        return [set(self.matching(conn, table, [p], ids)) for p in phrases]


INDEX = Fts5Index()
