"""Postgres full-text search: ``search_docs`` (schema_pg) ranked by FTS5's BM25.

A phrase from ``query.phrase`` (``"deploy"*``, ``"get_child_arguments"``) becomes a
``tsquery`` through the same ``lore`` configuration the index uses (split on every
non-alphanumeric character, Snowball English stems, no stop words): a word, a prefix
(``'deploy':*``) or a phrase of adjacent words (``'get' <-> 'child' <-> 'argument'``).

BM25 is FTS5's: ``idf = ln((N - df + 0.5) / (df + 0.5))`` (at least 1e-6) per phrase,
``k1 = 1.2``, ``b = 0.75``, document length in tokens. FTS5 counts the three scope
tokens of each row in its length, so ``SCOPE_TOKENS`` is added here too. ``N``,
the average length and a word's ``df`` are read from the statistics the index keeps
itself (schema v12: ``search_totals``, ``search_terms``), one key lookup each, exact
as FTS5's: counting matches instead fetched every matching row from the heap (4–7
µs a row; 0.2–0.5 s of a cold search at 1 M messages). A prefix's ``df`` is the sum
of its words' (an upper bound: a row with two of them counts twice), counted exactly
when that sum or the whole index is small; a phrase of several words is counted,
capped. Values are cached briefly, per database.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from lore_gateway.memory.search.textindex import Table
from lore_gateway.storage.base import Connection
from lore_gateway.storage.postgres import PgConnection

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
# A prefix whose words' summed df is at most this is counted exactly (cheap: few
# rows), and so is every prefix while the index is small (its pages are in memory):
# the sum is an upper bound, and small stores (LoCoMo, the coding set) rank as FTS5.
EXACT_PREFIX_ROWS = 2_000
SMALL_INDEX_ROWS = 50_000
_DOCS = {"messages": "content_docs", "context": "context_docs"}
_TOKENS = {"messages": "content_tokens", "context": "context_tokens"}
_LEXEME = re.compile(r"'((?:[^']|'')*)'(:\*)?")


# FTS5's bm25() of every candidate at once (what schema_pg's ``lore_bm25`` computes
# row by row, as one set-wise statement). Unnesting a whole ``tsvector`` is most of
# the cost, so each candidate keeps only the query's lexemes first: ``setweight``
# marks them (weight A; the index has only D) and ``ts_filter`` drops the rest, for
# a prefix every stored lexeme that starts with it. Their positions are the term
# frequencies; a phrase of several words counts only where its words are adjacent
# (``doc @@ phrase``), and then as often as its rarest word.
_BM25 = """
WITH c AS MATERIALIZED (
    SELECT message_id, {column} AS doc, {length} + {scope_tokens} AS dl FROM search_docs
    WHERE message_id >= ?{where} AND {column} @@ ?::tsquery),
q AS MATERIALIZED (
    SELECT * FROM unnest(?::text[], ?::integer[], ?::boolean[], ?::double precision[],
                         ?::tsquery[]) WITH ORDINALITY AS q(lexeme, term, prefix, idf, phrase, k)),
w AS (SELECT coalesce(array_agg(lexeme) FILTER (WHERE NOT prefix), '{{}}') AS exact,
             array_agg(lexeme) FILTER (WHERE prefix) AS prefixes FROM q),
u AS MATERIALIZED (
    SELECT c.message_id, u.lexeme, cardinality(u.positions) AS n
    FROM c, w, unnest(ts_filter(setweight(c.doc, 'A', CASE WHEN w.prefixes IS NULL
        THEN w.exact ELSE w.exact || coalesce((
            SELECT array_agg(l) FROM unnest(tsvector_to_array(c.doc)) l
            WHERE l ^@ ANY(w.prefixes)), '{{}}')
        END), '{{a}}')) u),
f AS (
    SELECT u.message_id, q.k, sum(u.n)::double precision AS tf
    FROM u JOIN q ON u.lexeme = q.lexeme AND NOT q.prefix GROUP BY u.message_id, q.k
    UNION ALL
    SELECT u.message_id, q.k, sum(u.n)::double precision AS tf
    FROM u JOIN q ON q.prefix AND starts_with(u.lexeme, q.lexeme) GROUP BY u.message_id, q.k),
t AS (
    SELECT c.message_id, c.dl, q.term, max(q.idf) AS idf,
           CASE WHEN bool_and(coalesce(c.doc @@ q.phrase, true))
                THEN min(coalesce(f.tf, 0)) ELSE 0 END AS tf
    FROM c CROSS JOIN q LEFT JOIN f ON f.message_id = c.message_id AND f.k = q.k
    GROUP BY c.message_id, c.dl, q.term)
SELECT message_id, coalesce(sum(idf * tf * 2.2
                                / (tf + 1.2 * (0.25 + 0.75 * dl / greatest(?::double precision,
                                                                         1e-9)))
                            ORDER BY term) FILTER (WHERE tf > 0), 0) AS score
FROM t GROUP BY message_id ORDER BY score DESC, message_id DESC LIMIT {limit}
"""


def _store(conn: Connection) -> tuple[object, ...]:
    """Which database ``conn`` reads: statistics are cached per process, and one
    process may read several (``lore db copy``, the tests)."""
    info = conn.raw.info if isinstance(conn, PgConnection) else None
    return (info.host, info.port, info.dbname) if info is not None else ()


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


def _parsed(tsquery: str, prefix: bool) -> _Phrase:
    lexemes = tuple(m.group(1).replace("''", "'") for m in _LEXEME.finditer(tsquery))
    return _Phrase(tsquery, lexemes, prefix and len(lexemes) == 1)


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
        found = _parsed(str(row[0]) if row is not None and row[0] else "", prefix)
        self._phrases.put(phrase, found)
        return found

    def _translate(self, conn: Connection, phrases: Sequence[str]) -> None:
        """Translate every phrase not yet cached, in one statement."""
        missing = sorted({p for p in phrases if self._phrases.get(p) is None})
        if len(missing) < 2:
            return  # ``_phrase`` does one on its own
        parts = [_fts5_phrase(p) for p in missing]
        rows = conn.execute(
            "SELECT CASE WHEN q.prefix THEN to_tsquery('lore', quote_literal(lower(q.body))"
            " || ':*')::text ELSE phraseto_tsquery('lore',"
            " regexp_replace(q.body, '[^[:alnum:]]+', ' ', 'g'))::text END"
            " FROM unnest(?::text[], ?::boolean[]) WITH ORDINALITY AS q(body, prefix, n)"
            " ORDER BY q.n", ([b for b, _ in parts], [f for _, f in parts])).fetchall()
        for phrase, (_body, prefix), row in zip(missing, parts, rows, strict=True):
            self._phrases.put(phrase, _parsed(str(row[0]) if row[0] else "", prefix))

    def _tsquery(self, conn: Connection, phrases: Sequence[str],
                 conjunction: bool) -> tuple[list[_Phrase], str]:
        self._translate(conn, phrases)
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
        key = ("df", _store(conn), table, phrase.tsquery, cap)
        cached = self._stats.get(key, size)
        if isinstance(cached, int):
            return cached
        count = self._kept_df(conn, table, phrase, size)
        if count is None:
            column = _COLUMNS[table][0]
            row = conn.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM search_docs WHERE {column} @@ ?::tsquery"
                " LIMIT ?) s", (phrase.tsquery, cap + 1)).fetchone()
            count = int(row[0]) if row is not None else 0
        count = min(count, cap + 1)
        self._stats.put(key, count, size)
        return count

    def _kept_df(self, conn: Connection, table: Table, phrase: _Phrase,
                 size: int) -> int | None:
        """A one-word phrase's df from ``search_terms`` (a prefix's as the sum of its
        words'), or None where it must be counted: a phrase of several words, or a
        prefix whose sum is small enough to count exactly."""
        if len(phrase.lexemes) != 1:
            return None
        docs, lexeme = _DOCS[table], phrase.lexemes[0]
        if not phrase.prefix:
            row = conn.execute(f"SELECT {docs} FROM search_terms WHERE lexeme = ?",
                               (lexeme,)).fetchone()
            return int(row[0]) if row is not None else 0
        if ord(lexeme[-1]) >= 0x10FFFF or self._corpus(conn, table, size)[0] <= SMALL_INDEX_ROWS:
            return None  # (a small index: count it)
        # The lexemes starting with the prefix: a range of the "C"-collated key.
        row = conn.execute(
            f"SELECT coalesce(sum({docs}), 0) FROM search_terms WHERE lexeme >= ?"
            " AND lexeme < ?", (lexeme, lexeme[:-1] + chr(ord(lexeme[-1]) + 1))).fetchone()
        total = int(row[0]) if row is not None else 0
        return total if total > EXACT_PREFIX_ROWS else None

    def count_phrase(self, conn: Connection, phrase: str, cap: int) -> int:
        parsed = self._phrase(conn, phrase)
        return self._df(conn, "messages", parsed, cap) if parsed.tsquery else 0

    def _corpus(self, conn: Connection, table: Table, size: int) -> tuple[int, float]:
        """(rows, average length in tokens) of the index."""
        key = ("corpus", _store(conn), table)
        cached = self._stats.get(key, size)
        if isinstance(cached, tuple):
            return cached
        row = conn.execute(f"SELECT docs, {_TOKENS[table]} FROM search_totals").fetchone()
        docs, tokens = (int(row[0]), int(row[1])) if row is not None else (0, 0)
        found = (docs, tokens / docs if docs else 0.0)
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
            _BM25.format(column=column, length=length, where=where, limit=int(limit),
                         scope_tokens=SCOPE_TOKENS),
            (floor, *args, query, lexemes, terms, prefixes, idfs, gates,
             avgdl + SCOPE_TOKENS))]

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

    def matching_each(self, conn: Connection, table: Table, phrases: Sequence[str],
                      ids: Sequence[int]) -> list[set[int]]:
        found: list[set[int]] = [set() for _ in phrases]
        if not ids or not phrases:
            return found
        self._translate(conn, phrases)
        queries = [self._phrase(conn, p).tsquery for p in phrases]
        numbered = [(i, q) for i, q in enumerate(queries) if q]
        if not numbered:
            return found
        column = _COLUMNS[table][0]
        for mid, i in conn.execute(
                f"SELECT s.message_id, q.i FROM search_docs s,"
                " unnest(?::integer[], ?::tsquery[]) AS q(i, query)"
                f" WHERE s.message_id = ANY(?) AND s.{column} @@ q.query",
                ([i for i, _ in numbered], [q for _, q in numbered], list(ids))):
            found[int(i)].add(int(mid))
        return found


INDEX = PgTextIndex()
