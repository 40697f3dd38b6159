"""Vector search on Postgres: pgvector's cosine distance, computed by the server.

Every instance sees every vector the moment it is committed, so there is no
per-process index to load or refresh (SQLite's ``vectors.VectorIndex`` keeps one).
The scan is exact over the scope's rows; at team sizes that is milliseconds, and an
HNSW index can be added later without changing this query's results much.
"""

from __future__ import annotations

from lore_gateway.memory.embed import FloatArray
from lore_gateway.storage.base import Connection


class PgVectors:
    def __init__(self, model_name: str) -> None:
        self._model = model_name

    def search(self, conn: Connection, query: FloatArray, *, tenant: str,
               project: str | None, session: str | None, k: int) -> dict[int, float]:
        """Up to ``k`` message ids of the scope with their cosine to ``query``."""
        where, args = "m.tenant = ?", [tenant]
        if project is not None:
            where += " AND m.project = ?"
            args.append(project)
        if session is not None:
            where += " AND m.session = ?"
            args.append(session)
        text = "[" + ",".join(f"{x:.7g}" for x in query.tolist()) + "]"
        rows = conn.execute(
            "SELECT e.message_id, 1 - (e.vector <=> ?::vector) AS cosine FROM embeddings e"
            f" JOIN messages m ON m.id = e.message_id WHERE {where} AND e.model = ?"
            " ORDER BY e.vector <=> ?::vector LIMIT ?",
            (text, *args, self._model, text, k)).fetchall()
        return {int(mid): float(cos) for mid, cos in rows}
