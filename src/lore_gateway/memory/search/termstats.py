"""Document frequencies of query terms, counted with a cap and cached.

:func:`lore_gateway.memory.search.query.plan_match` needs to know how many stored rows
each query term matches before it asks FTS5 to rank anything. FTS5 keeps no
per-term counts (``fts5vocab`` walks the whole doclist, as BM25's IDF does), so
the count is a capped walk, ``LIMIT cap + 1`` over the term's rowids: about 30 ns
a row, so a term in a million rows costs no more than one at the cap. Counts are
cached per phrase and refreshed when the store has grown by a quarter or after a
few minutes, whichever comes first; between refreshes a count is an estimate,
which is all the planner needs.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from lore_gateway.storage.base import Connection

# Cached phrases (a few dozen bytes each). Recall queries repeat their vocabulary.
MAX_ENTRIES = 50_000
# A cached count is re-taken after this long or once the store grew by GROWTH.
TTL_S = 300.0
GROWTH = 1.25


class TermStats:
    """Capped row counts of full-text phrases and scopes, cached (thread-safe); the
    counting itself is the text index's (``textindex.TextIndex``)."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, ttl_s: float = TTL_S) -> None:
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._cache: OrderedDict[tuple[Hashable, int], tuple[int, int, float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def store_rows(conn: Connection) -> int:
        """Rows ever stored (the highest message id): a cheap upper bound of N."""
        row = conn.execute("SELECT max(id) FROM messages").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def rows(self, key_: Hashable, count: Callable[[int], int], *, cap: int,
             store_rows: int) -> int:
        """``count(cap)`` (rows matching ``key_``, or ``cap + 1`` if more), cached."""
        key = (key_, cap)
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                known, rows_then, taken = cached
                if now - taken < self._ttl_s and store_rows <= rows_then * GROWTH:
                    return known
        found = count(cap)
        with self._lock:
            self._cache[key] = (found, store_rows, now)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return found
