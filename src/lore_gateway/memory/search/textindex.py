"""The full-text index behind search, one implementation per backend.

``search.py`` keeps every ranking decision (which terms, the weighted sum of
signals, neighbours, confidence) in Python, shared by both backends; an index only
answers the four questions that need the backend's own full-text engine: which
scope token a scope has, how many rows match a phrase (for the planner), the
newest rows matching a query, and the BM25 best rows. SQLite answers with FTS5
(``text_sqlite``), Postgres with ``tsvector`` and one BM25 statement per list
(``text_postgres``), which computes FTS5's BM25 formula in SQL so both rank alike.

Queries arrive as FTS5 phrases (``query.phrase``: ``"word"``, ``"word"*``); each
index translates them. ``table`` is ``messages`` (a message's own text) or
``context`` (the message with the one before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from lore_gateway.storage.base import Connection

Table = Literal["messages", "context"]


class TextIndex(Protocol):
    # How ``messages.tenant`` is written where a search must not use its index
    # (SQLite's unary ``+``; Postgres has no such hint).
    tenant_column: str

    def scope_token(self, conn: Connection, kind: str, tenant: str, name: str) -> object | None:
        """An opaque token for the scope (``kind`` t/p/s), or None if nothing is stored there."""

    def count_scope(self, conn: Connection, token: object, cap: int) -> int:
        """Rows of the scope, up to ``cap + 1``."""

    def count_phrase(self, conn: Connection, phrase: str, cap: int) -> int:
        """Rows of ``messages`` whose text matches ``phrase``, up to ``cap + 1``."""

    def newest(self, conn: Connection, table: Table, phrases: Sequence[str], *,
               conjunction: bool, token: object | None, limit: int,
               offset: int = 0) -> list[int]:
        """Ids of the newest matches, newest first (skipping ``offset``)."""

    def bm25(self, conn: Connection, table: Table, phrases: Sequence[str], *,
             conjunction: bool, token: object | None, floor: int,
             limit: int) -> list[tuple[int, float]]:
        """The ``limit`` best matches with id ≥ ``floor`` and their BM25 (higher is better)."""

    def matching(self, conn: Connection, table: Table, phrases: Sequence[str],
                 ids: Sequence[int]) -> list[int]:
        """Which of ``ids`` match any of ``phrases``."""

    def matching_each(self, conn: Connection, table: Table, phrases: Sequence[str],
                      ids: Sequence[int]) -> list[set[int]]:
        """For each phrase, which of ``ids`` match it (one statement where the
        backend can: a round trip per phrase is what costs on Postgres)."""


def text_index(conn: Connection) -> TextIndex:
    """The index of ``conn``'s backend (one per process)."""
    if conn.backend == "postgres":
        from lore_gateway.storage.text_postgres import INDEX as PG_INDEX

        return PG_INDEX
    from lore_gateway.storage.text_sqlite import INDEX

    return INDEX
