"""What the "not kept" tests look at: every table of a gateway's database, its
search index terms, and the text a search finds (issue 36)."""

from __future__ import annotations

from typing import Any

from lore_gateway.memory.store.records import Identity
from lore_gateway.storage import db
from lore_gateway.testing import wait_until

# Counts of requests and tokens per interval (ui/samples.py): no session, no text.
COUNTS_ONLY = {"metrics_samples"}


def tables(gw: Any) -> dict[str, list[str]]:
    """Every table of a running gateway's memory (``rows``), taken once the gateway
    has ended every response (a turn is handed to storage after its last byte
    reached the client) and written what it was given."""
    wait_until(lambda: gw.proxy.active == 0, "the gateway to end its responses")
    gw.memory.flush(timeout=20)
    return rows(gw.memory)


def rows(memory: Any) -> dict[str, list[str]]:
    """Every table's rows, as text, sorted. SQLite: the FTS5 shadow tables too (the
    index segments themselves); Postgres: ``search_docs`` and ``search_terms``."""

    def read(conn: Any) -> dict[str, list[str]]:
        if conn.backend == "postgres":
            names = [str(r[0]) for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema ="
                " current_schema() AND table_type = 'BASE TABLE'")]
        else:
            names = [str(r[0]) for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE"
                " 'CREATE VIRTUAL%'")]
        return {name: sorted(repr(row) for row in conn.execute(f'SELECT * FROM "{name}"'))
                for name in names}

    found: dict[str, list[str]] = memory.read(read)
    return found


def changed(before: dict[str, list[str]], after: dict[str, list[str]]) -> set[str]:
    return {name for name in before.keys() | after.keys()
            if before.get(name) != after.get(name)}


def holding(snapshot: dict[str, list[str]], text: str) -> dict[str, list[str]]:
    """The rows (as text) of every table that contain ``text``, any case."""
    needle = text.lower()
    found = {name: [r for r in rows if needle in r.lower()] for name, rows in snapshot.items()}
    return {name: rows for name, rows in found.items() if rows}


def index_terms(memory: Any, prefix: str) -> list[str]:
    """Terms of either search index that start with ``prefix`` (SQLite: read through
    ``fts5vocab`` on a connection of its own; Postgres keeps them in ``search_terms``,
    which ``tables`` reads)."""
    if memory.database.backend == "postgres":
        return []
    conn = db.connect(memory.database)
    try:
        terms: list[str] = []
        for index in ("messages_fts", "context_fts"):
            conn.execute(f"CREATE VIRTUAL TABLE temp.v_{index} USING fts5vocab(main, {index},"
                         " 'row')")
            terms += [str(r[0]) for r in conn.execute(
                f"SELECT term FROM temp.v_{index} WHERE term >= ? AND term < ?",
                (prefix, prefix + "\uffff"))]
        return terms
    finally:
        conn.close()


def search_hits(memory: Any, query: str) -> list[str]:
    """What a search of every project finds (BM25 here: the tests run without the model)."""
    found = memory.search_sync(query, identity=Identity("personal", "", ""), scope="all")
    return [h.content for h in found.hits]
