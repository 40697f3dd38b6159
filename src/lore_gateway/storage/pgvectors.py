"""Vector search on Postgres: pgvector's cosine distance, computed by the server.

Every instance sees every vector the moment it is committed, so there is no
per-process index to load or refresh (SQLite's ``vectors.VectorIndex`` keeps one).
A project or session scope is scanned exactly (its rows come from the scope's
index; tens of thousands at most). Scope "all" of the default model walks the HNSW
index (schema v12): an exact scan of a million vectors took ~1.6 s. The index
returns the ``HNSW_CANDIDATES`` nearest of the whole store, then the tenant's are
kept; a tenant holding too small a share of the store to fill ``k`` from them is
scanned exactly instead. docs/search.md has the overlap with the exact top 10.
"""

from __future__ import annotations

from lore_gateway.memory.embed.embedder import FloatArray
from lore_gateway.storage.base import Connection
from lore_gateway.storage.schema_pg import HNSW_DIM, HNSW_MODEL

# Nearest rows the HNSW walk returns (its ``ef_search``): twice a search's k, so the
# tenant filter and ties still leave k (pgvector 0.6 returns at most ef_search rows).
HNSW_CANDIDATES = 200


class PgVectors:
    def __init__(self, model_name: str, *, approximate: bool = True) -> None:
        self._model = model_name
        self._approximate = approximate and model_name == HNSW_MODEL

    def search(self, conn: Connection, query: FloatArray, *, tenant: str,
               project: str | None, session: str | None, k: int) -> dict[int, float]:
        """Up to ``k`` message ids of the scope with their cosine to ``query``."""
        text = "[" + ",".join(f"{x:.7g}" for x in query.tolist()) + "]"
        if self._approximate and project is None and session is None \
                and len(query) == HNSW_DIM and k <= HNSW_CANDIDATES:
            found = self._nearest(conn, text, tenant, k)
            if len(found) >= k:
                return found
        where, args = "m.tenant = ?", [tenant]
        if project is not None:
            where += " AND m.project = ?"
            args.append(project)
        if session is not None:
            where += " AND m.session = ?"
            args.append(session)
        rows = conn.execute(
            "SELECT e.message_id, 1 - (e.vector <=> ?::vector) AS cosine FROM embeddings e"
            f" JOIN messages m ON m.id = e.message_id WHERE {where} AND e.model = ?"
            " ORDER BY e.vector <=> ?::vector LIMIT ?",
            (text, *args, self._model, text, k)).fetchall()
        return {int(mid): float(cos) for mid, cos in rows}

    @staticmethod
    def _nearest(conn: Connection, text: str, tenant: str, k: int) -> dict[int, float]:
        """The tenant's share of the index's nearest HNSW_CANDIDATES (the model is a
        literal: a partial index is not used by a generic plan with a parameter)."""
        cast = f"vector({HNSW_DIM})"
        with conn:
            conn.execute(f"SET LOCAL hnsw.ef_search = {HNSW_CANDIDATES}")
            rows = conn.execute(
                f"WITH near AS MATERIALIZED (SELECT message_id,"
                f" vector::{cast} <=> ?::{cast} AS d FROM embeddings"
                f" WHERE model = '{HNSW_MODEL}' ORDER BY vector::{cast} <=> ?::{cast}"
                f" LIMIT {HNSW_CANDIDATES})"
                " SELECT n.message_id, 1 - n.d FROM near n JOIN messages m"
                " ON m.id = n.message_id WHERE m.tenant = ? ORDER BY n.d, n.message_id LIMIT ?",
                (text, text, tenant, k)).fetchall()
        return {int(mid): float(cos) for mid, cos in rows}
