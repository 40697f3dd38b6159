"""Vectors: storing message embeddings, and the in-memory vector index.

Embedding costs ~10 ms of CPU per short text on this class of machine, so it
never runs on the event loop nor per request: the writer thread hands freshly
committed message ids to the embedding process (``embed_process.py``: one
low-priority process, bounded queue), which calls :func:`embed_and_store`.

Search needs cosine similarity over every stored message of a scope, and at a
million messages a float32 matrix is 1.5 GB, too much to keep resident. The
:class:`VectorIndex` therefore keeps only a 384-bit sign code per message
(48 bytes; 48 MB per million) plus ids and scope codes. A query ranks a scope by
Hamming distance between sign codes (a cheap proxy for the angle), then scores
the best few hundred exactly with their float32 vectors read from SQLite. Small
scopes (a session, a typical project) skip the proxy and are scored exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import apsw
import numpy as np
import numpy.typing as npt

from lore_gateway.memory.embed import Embedder, FloatArray, as_blob

log = logging.getLogger(__name__)

# Messages embedded per batch; also the unit of one write transaction.
EMBED_BATCH = 64
# Only the first characters of a message are embedded: MiniLM reads at most 256
# word pieces (~1,000 characters of prose), so longer text is wasted tokenisation.
EMBED_CHARS = 2_000
# A scope up to this size is scored exactly (all its vectors read from SQLite);
# larger scopes are pre-ranked by sign-code Hamming distance first.
EXACT_SCOPE_ROWS = 3_000
# Candidates kept from the Hamming pre-rank for exact scoring.
HAMMING_CANDIDATES = 600
# Upper bound of sign codes held in memory across tenants (48 B each: ~190 MB).
MAX_INDEX_ROWS = 4_000_000

IntArray = npt.NDArray[np.int64]


def sign_codes(vectors: FloatArray) -> npt.NDArray[np.uint64]:
    """Pack the sign bits of each row into 6 uint64 words (384 bits)."""
    bits = np.packbits(vectors > 0, axis=1)
    return np.ascontiguousarray(bits).view(np.uint64)


def embed_and_store(conn: apsw.Connection, embedder: Embedder, ids: list[int]) -> int:
    """Embed the given stored messages and write their vectors; how many were written.

    Runs in the embedding process (``memory/embed_process.py``), batch by batch.
    """
    written = 0
    for start in range(0, len(ids), EMBED_BATCH):
        batch = ids[start:start + EMBED_BATCH]
        marks = ",".join("?" * len(batch))
        rows = [(int(r[0]), str(r[1])) for r in conn.execute(
            f"SELECT id, substr(content, 1, {EMBED_CHARS}) FROM messages WHERE id IN ({marks})",
            batch)]
        if not rows:
            continue
        vectors = embedder.embed([text for _, text in rows])
        with conn:
            conn.executemany(
                "INSERT OR REPLACE INTO embeddings(message_id, model, vector) VALUES (?,?,?)",
                [(mid, embedder.model_name, as_blob(vec))
                 for (mid, _), vec in zip(rows, vectors, strict=True)])
        written += len(rows)
    return written


@dataclass(slots=True)
class _TenantIndex:
    """Sign codes of one tenant's messages, with the scope of each row."""

    watermark: int = 0
    ids: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    codes: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros((0, 6), np.uint64))
    projects: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    sessions: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    project_codes: dict[str, int] = field(default_factory=dict)
    session_codes: dict[str, int] = field(default_factory=dict)


class VectorIndex:
    """Cosine search over stored embeddings, one lazily loaded index per tenant.

    Not thread-safe; the search thread owns it. New embeddings are picked up
    incrementally (rows above the tenant's watermark) at the start of each search.
    """

    def __init__(self, model_name: str, dim: int, *, max_rows: int = MAX_INDEX_ROWS) -> None:
        self._model = model_name
        self._dim = dim
        self._max_rows = max_rows
        self._tenants: dict[str, _TenantIndex] = {}

    def search(self, conn: apsw.Connection, query: FloatArray, *, tenant: str,
               project: str | None, session: str | None, k: int) -> dict[int, float]:
        """Up to ``k`` message ids of the scope with their cosine to ``query``."""
        index = self._refresh(conn, tenant)
        mask = np.ones(len(index.ids), dtype=bool)
        if project is not None:
            code = index.project_codes.get(project)
            if code is None:
                return {}
            mask &= index.projects == code
        if session is not None:
            code = index.session_codes.get(session)
            if code is None:
                return {}
            mask &= index.sessions == code
        rows = np.flatnonzero(mask)
        if len(rows) > EXACT_SCOPE_ROWS:
            qcode = sign_codes(query[None, :])[0]
            distance = np.bitwise_count(index.codes[rows] ^ qcode).sum(axis=1)
            keep = min(len(rows), max(HAMMING_CANDIDATES, k))
            rows = rows[np.argpartition(distance, keep - 1)[:keep]]
        scores = self.exact(conn, query, index.ids[rows].tolist())
        best = sorted(scores.items(), key=lambda kv: -kv[1])[:k]
        return dict(best)

    def exact(self, conn: apsw.Connection, query: FloatArray,
              ids: Iterable[int]) -> dict[int, float]:
        """Cosine of ``query`` to each stored vector among ``ids`` (missing ids are skipped)."""
        id_list = list(ids)
        out: dict[int, float] = {}
        for start in range(0, len(id_list), 900):  # SQLite's default variable limit is 32766
            chunk = id_list[start:start + 900]
            marks = ",".join("?" * len(chunk))
            got = [(int(r[0]), r[1]) for r in conn.execute(
                f"SELECT message_id, vector FROM embeddings WHERE message_id IN ({marks})"
                " AND model = ?", [*chunk, self._model])]
            if not got:
                continue
            matrix = np.frombuffer(b"".join(bytes(v) for _, v in got), dtype="<f4").reshape(
                len(got), self._dim)
            sims = matrix @ query
            out.update(zip((mid for mid, _ in got), sims.tolist(), strict=True))
        return out

    def _refresh(self, conn: apsw.Connection, tenant: str) -> _TenantIndex:
        index = self._tenants.get(tenant)
        if index is None:
            self._evict_for_new_tenant()
            index = self._tenants[tenant] = _TenantIndex()
        rows: list[tuple[Any, ...]] = conn.execute(
            "SELECT e.message_id, m.project, m.session, e.vector FROM embeddings e"
            " JOIN messages m ON m.id = e.message_id"
            " WHERE e.message_id > ? AND m.tenant = ? AND e.model = ? ORDER BY e.message_id",
            (index.watermark, tenant, self._model)).fetchall()
        if not rows:
            return index
        ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
        vectors = np.frombuffer(b"".join(bytes(r[3]) for r in rows), dtype="<f4").reshape(
            len(rows), self._dim)
        projects = np.fromiter(
            (index.project_codes.setdefault(str(r[1]), len(index.project_codes)) for r in rows),
            dtype=np.int32, count=len(rows))
        sessions = np.fromiter(
            (index.session_codes.setdefault(str(r[2]), len(index.session_codes)) for r in rows),
            dtype=np.int32, count=len(rows))
        index.ids = np.concatenate([index.ids, ids])
        index.codes = np.concatenate([index.codes, sign_codes(vectors)])
        index.projects = np.concatenate([index.projects, projects])
        index.sessions = np.concatenate([index.sessions, sessions])
        index.watermark = int(ids[-1])
        if len(index.ids) > self._max_rows:
            # Keep the most recent rows: old memories stay reachable through BM25.
            cut = len(index.ids) - self._max_rows
            index.ids, index.codes = index.ids[cut:], index.codes[cut:]
            index.projects, index.sessions = index.projects[cut:], index.sessions[cut:]
        return index

    def _evict_for_new_tenant(self) -> None:
        total = sum(len(t.ids) for t in self._tenants.values())
        while self._tenants and total > self._max_rows // 2:
            victim = next(iter(self._tenants))  # insertion order: the oldest loaded
            total -= len(self._tenants.pop(victim).ids)
