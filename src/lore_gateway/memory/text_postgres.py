"""Postgres full-text search: ``search_docs`` (schema_pg) ranked by FTS5's BM25.

A phrase from ``query.phrase`` (``"deploy"*``, ``"get_child_arguments"``) becomes a
``tsquery`` through the same ``lore`` configuration the index uses (split on every
non-alphanumeric character, Snowball English stems, no stop words): a word, a prefix
(``'deploy':*``) or a phrase of adjacent words (``'get' <-> 'child' <-> 'argument'``).

BM25 is FTS5's: ``idf = ln((N - df + 0.5) / (df + 0.5))`` (at least 1e-6) per phrase,
``k1 = 1.2``, ``b = 0.75``, document length in tokens. FTS5 counts the three scope
tokens of each row in its length, so ``SCOPE_TOKENS`` is added here too. ``N``,
the average length and each phrase's ``df`` are counted in SQL and cached briefly:
between refreshes they are estimates, as FTS5's own are exact; the ranking of a
query's candidates barely moves with them.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from lore_gateway.memory.textindex import Table
from lore_gateway.storage.base import Connection

_COLUMNS = {"messages": ("content", "content_len"), "context": ("context", "context_len")}
# FTS5's row length includes the scope column's three tokens (``t1 p2 s3``).
SCOPE_TOKENS = 3
# Translated phrases and per-phrase document frequencies kept (a few dozen bytes each).
MAX_CACHED = 50_000
# Corpus statistics (row count, average length) and df counts are re-taken after this long.
STATS_TTL_S = 60.0
# Matches counted for a phrase's df before giving up (the planner's cap is lower).
DF_CAP = 1_000_000
# ... or once the store has grown by this factor (a young store grows fast).
GROWTH = 1.1
_LEXEME = re.compile(r"'((?:[^']|'')*)'(:\*)?")


@dataclass(frozen=True, slots=True)
class _Phrase:
    """One FTS5 phrase as Postgres sees it."""

    tsquery: str  # '' when nothing of it is indexable (only punctuation)
    lexemes: tuple[str, ...]
    prefix: bool


def _fts5_phrase(phrase: str) -> tuple[str, bool]:
    """The text and prefix flag of a quoted FTS5 phrase (``"a b"*`` → ``a b``, True)."""
    prefix = phrase.endswith("*")
    body = phrase[:-1] if prefix else phrase
    if len(body) >= 2 and body[0] == body[-1] == '"':
        body = body[1:-1].replace('""', '"')
    return body, prefix


class _Cache:
    """A small thread-safe LRU with expiry; an entry also expires once the store
    has grown by GROWTH since it was taken (``size``: the highest message id)."""

    def __init__(self, ttl: float | None) -> None:
        self._ttl = ttl
        self._items: OrderedDict[object, tuple[object, float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: object, size: int = 0) -> object | None:
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            value, taken, size_then = found
            if (self._ttl is not None and time.monotonic() - taken > self._ttl) \
                    or size > size_then * GROWTH:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return value

    def put(self, key: object, value: object, size: int = 0) -> None:
        with self._lock:
            self._items[key] = (value, time.monotonic(), size)
            self._items.move_to_end(key)
            while len(self._items) > MAX_CACHED:
                self._items.popitem(last=False)


class PgTextIndex:
    tenant_column = "tenant"

    def __init__(self) -> None:
        self._phrases = _Cache(ttl=None)
        self._stats = _Cache(ttl=STATS_TTL_S)

    # --- translation -----------------------------------------------------------------

    def _phrase(self, conn: Connection, phrase: str) -> _Phrase:
        cached = self._phrases.get(phrase)
        if isinstance(cached, _Phrase):
            return cached
        text, prefix = _fts5_phrase(phrase)
        if prefix:
            row = conn.execute(
                "SELECT to_tsquery('lore', quote_literal(lower(?)) || ':*')::text",
                (text,)).fetchone()
        else:
            row = conn.execute(
                "SELECT phraseto_tsquery('lore', regexp_replace(?, '[^[:alnum:]]+', ' ', 'g'))"
                "::text", (text,)).fetchone()
        tsquery = str(row[0]) if row is not None and row[0] else ""
        lexemes = tuple(m.group(1).replace("''", "'") for m in _LEXEME.finditer(tsquery))
        found = _Phrase(tsquery, lexemes, prefix and len(lexemes) == 1)
        self._phrases.put(phrase, found)
        return found

    def _tsquery(self, conn: Connection, phrases: Sequence[str],
                 conjunction: bool) -> tuple[list[_Phrase], str]:
        parsed = [p for p in (self._phrase(conn, x) for x in phrases) if p.tsquery]
        joiner = " & " if conjunction else " | "
        return parsed, joiner.join(f"({p.tsquery})" for p in parsed)

    # --- scope ---------------------------------------------------------------------

    def scope_token(self, conn: Connection, kind: str, tenant: str, name: str) -> object | None:
        column = {"t": None, "p": "project", "s": "session"}[kind]
        where = "tenant = ?" + ("" if column is None else f" AND {column} = ?")
        args = (tenant,) if column is None else (tenant, name)
        row = conn.execute(f"SELECT 1 FROM search_docs WHERE {where} LIMIT 1", args).fetchone()
        return None if row is None else (kind, tenant, name)

    @staticmethod
    def _scope_sql(token: object | None) -> tuple[str, tuple[str, ...]]:
        if token is None:
            return "", ()
        assert isinstance(token, tuple)
        kind, tenant, name = token
        if kind == "p":
            return " AND tenant = ? AND project = ?", (tenant, name)
        if kind == "s":
            return " AND tenant = ? AND session = ?", (tenant, name)
        return " AND tenant = ?", (tenant,)

    # --- counting ------------------------------------------------------------------

    def count_scope(self, conn: Connection, token: object, cap: int) -> int:
        where, args = self._scope_sql(token)
        row = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM search_docs WHERE true{where}"
                           " LIMIT ?) s", (*args, cap + 1)).fetchone()
        return int(row[0]) if row is not None else 0

    @staticmethod
    def _size(conn: Connection) -> int:
        row = conn.execute("SELECT max(message_id) FROM search_docs").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def _df(self, conn: Connection, table: Table, phrase: _Phrase, cap: int,
            size: int = 0) -> int:
        key = ("df", table, phrase.tsquery, cap)
        cached = self._stats.get(key, size)
        if isinstance(cached, int):
            return cached
        column = _COLUMNS[table][0]
        row = conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM search_docs WHERE {column} @@ ?::tsquery"
            " LIMIT ?) s", (phrase.tsquery, cap + 1)).fetchone()
        count = int(row[0]) if row is not None else 0
        self._stats.put(key, count, size)
        return count

    def count_phrase(self, conn: Connection, phrase: str, cap: int) -> int:
        parsed = self._phrase(conn, phrase)
        return self._df(conn, "messages", parsed, cap) if parsed.tsquery else 0

    def _corpus(self, conn: Connection, table: Table, size: int) -> tuple[int, float]:
        """(rows, average length in tokens) of the index."""
        key = ("corpus", table)
        cached = self._stats.get(key, size)
        if isinstance(cached, tuple):
            return cached
        length = _COLUMNS[table][1]
        row = conn.execute(f"SELECT count(*), coalesce(avg({length}), 0) FROM search_docs"
                           ).fetchone()
        found = (int(row[0]), float(row[1])) if row is not None else (0, 0.0)
        self._stats.put(key, found, size)
        return found

    # --- matching ------------------------------------------------------------------

    def newest(self, conn: Connection, table: Table, phrases: Sequence[str], *,
               conjunction: bool, token: object | None, limit: int,
               offset: int = 0) -> list[int]:
        _parsed, query = self._tsquery(conn, phrases, conjunction)
        if not query:
            return []
        column = _COLUMNS[table][0]
        where, args = self._scope_sql(token)
        return [int(r[0]) for r in conn.execute(
            f"SELECT message_id FROM search_docs WHERE {column} @@ ?::tsquery{where}"
            f" ORDER BY message_id DESC LIMIT {int(limit)} OFFSET {int(offset)}",
            (query, *args))]

    def bm25(self, conn: Connection, table: Table, phrases: Sequence[str], *,
             conjunction: bool, token: object | None, floor: int,
             limit: int) -> list[tuple[int, float]]:
        parsed, query = self._tsquery(conn, phrases, conjunction)
        if not query:
            return []
        size = self._size(conn)
        rows, avgdl = self._corpus(conn, table, size)
        lexemes: list[str] = []
        terms: list[int] = []
        prefixes: list[bool] = []
        idfs: list[float] = []
        gates: list[str | None] = []
        for number, phrase in enumerate(parsed):
            df = self._df(conn, table, phrase, DF_CAP, size)
            total = max(rows, df)  # the two counts were taken at different times
            idf = math.log((total - df + 0.5) / (df + 0.5))
            idf = idf if idf > 0 else 1e-6
            for lexeme in phrase.lexemes:
                lexemes.append(lexeme)
                terms.append(number)
                prefixes.append(phrase.prefix)
                idfs.append(idf)
                gates.append(phrase.tsquery if len(phrase.lexemes) > 1 else None)
        column, length = _COLUMNS[table]
        where, args = self._scope_sql(token)
        return [(int(r[0]), float(r[1])) for r in conn.execute(
            f"SELECT message_id, lore_bm25({column}, {length} + {SCOPE_TOKENS}, ?::text[],"
            f" ?::integer[], ?::boolean[], ?::double precision[], ?::tsquery[], ?) AS score"
            f" FROM search_docs WHERE {column} @@ ?::tsquery{where} AND message_id >= ?"
            f" ORDER BY score DESC, message_id DESC LIMIT {int(limit)}",
            (lexemes, terms, prefixes, idfs, gates, avgdl + SCOPE_TOKENS, query, *args,
             floor))]

    def matching(self, conn: Connection, table: Table, phrases: Sequence[str],
                 ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        _parsed, query = self._tsquery(conn, phrases, False)
        if not query:
            return []
        column = _COLUMNS[table][0]
        return [int(r[0]) for r in conn.execute(
            f"SELECT message_id FROM search_docs WHERE {column} @@ ?::tsquery"
            " AND message_id = ANY(?)", (query, list(ids)))]


INDEX = PgTextIndex()
