"""Vectors: storing message embeddings, and the in-memory vector index.

Embedding costs ~10 ms of CPU per short text on this class of machine, so it
never runs on the event loop nor per request: the writer thread hands freshly
committed message ids to the embedding process (``embed_process.py``: one
low-priority process, bounded queue), which calls :func:`embed_and_store`.

Search needs cosine similarity over every stored message of a scope, and at a
million messages a float32 matrix is 1.5 GB, too much to keep resident. The
:class:`VectorIndex` therefore keeps only a 384-bit SimHash per message (the signs
of 384 fixed random projections: 48 bytes, 48 MB per million) plus ids and scope
codes. The Hamming distance between two SimHashes estimates the angle between
the vectors. A large scope is ranked in two passes: by the first 256 bits over
every row (a million rows in ~3 ms), then by all 384 bits over the best 20,000;
the best 1,000 of those are scored exactly with their float32 vectors read from
SQLite. Small scopes (a session, a typical project)
skip the proxy and are scored exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from lore_gateway.memory.embed.embedder import DIM, FloatArray, as_blob
from lore_gateway.memory.search.render import is_recall_traffic
from lore_gateway.storage.base import Connection

log = logging.getLogger(__name__)

# Messages embedded per batch; also the unit of one write transaction.
EMBED_BATCH = 64
# Only the first characters of a message are embedded: MiniLM reads at most 256
# word pieces (~1,000 characters of prose), so longer text is wasted tokenisation.
EMBED_CHARS = 2_000
# A scope up to this size is scored exactly (all its vectors read from SQLite);
# larger scopes are pre-ranked by sign-code Hamming distance first.
EXACT_SCOPE_ROWS = 3_000
# Candidates kept from the 256-bit pass, then from the 384-bit pass for exact scoring
# (docs/search.md: on real MiniLM vectors a true neighbour can sit a few per cent
# down the Hamming order, so both passes keep generously; the exact step is cheap).
COARSE_CANDIDATES = 20_000
HAMMING_CANDIDATES = 1_000
# Words (64 bits each) of the SimHash, and how many the first pass reads.
CODE_WORDS = 6
COARSE_WORDS = 4
# Rows read from SQLite per step when an index is loaded (bounds the transient
# memory of loading a million vectors to ~75 MB).
LOAD_BATCH = 50_000
# Upper bound of sign codes held in memory across tenants (48 B each: ~190 MB).
MAX_INDEX_ROWS = 4_000_000

IntArray = npt.NDArray[np.int64]


def sign_codes(vectors: FloatArray) -> npt.NDArray[np.uint64]:
    """Pack the sign bits of each row into 6 uint64 words (384 bits)."""
    bits = np.packbits(vectors > 0, axis=1)
    return np.ascontiguousarray(bits).view(np.uint64)


def _projections(dim: int) -> FloatArray:
    """The fixed random hyperplanes of the SimHash (seeded: the same in every process).

    For the model's 384 dimensions they are read from the copy shipped in
    ``memory/model`` (bit-identical, ``tests/memory/test_footprint.py``):
    generating them imports ``numpy.random``, and with it OpenSSL's libcrypto,
    6.3 MiB of RSS in the process that searches, for one matrix."""
    if dim == DIM:
        from lore_gateway.memory.embed.model_files import simhash_planes_path

        data = simhash_planes_path().read_bytes()
        return np.frombuffer(data, dtype="<f4").reshape(dim, CODE_WORDS * 64).copy()
    return np.random.default_rng(384).standard_normal((dim, CODE_WORDS * 64)).astype(np.float32)


class VectorSearch(Protocol):
    """Nearest stored messages of a scope: this module's in-process index (SQLite)
    or pgvector in SQL (``pgvectors.PgVectors``)."""

    def search(self, conn: Connection, query: FloatArray, *, tenant: str,
               project: str | None, session: str | None, k: int) -> dict[int, float]: ...


class TextEmbedder(Protocol):
    """What search and storing vectors need of an embedder: the model
    (``embed.Embedder``), the embedding process's backlog view of it, which waits
    for quiet moments (``embed_process._Yielding``), or a search child's cache of
    query vectors in front of it (``search_child._QueryCache``)."""

    @property
    def model_name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str]) -> FloatArray: ...


def vector_search(conn: Connection, model_name: str, dim: int) -> VectorSearch:
    """The vector search of ``conn``'s backend."""
    if conn.backend == "postgres":
        from lore_gateway.storage.pgvectors import PgVectors

        return PgVectors(model_name)
    return VectorIndex(model_name, dim)


def vector_param(conn: Connection, vector: FloatArray) -> object:
    """A vector as the backend stores it: float32 bytes (SQLite), pgvector text."""
    if conn.backend == "postgres":
        return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"
    return as_blob(vector)


def embed_and_store(conn: Connection, embedder: TextEmbedder, ids: list[int]) -> int:
    """Embed the given stored messages and write their vectors; how many were written.

    Runs in the embedding process (``memory/embed/process.py``), batch by batch.
    """
    written = 0
    for start in range(0, len(ids), EMBED_BATCH):
        batch = ids[start:start + EMBED_BATCH]
        marks = ",".join("?" * len(batch))
        # The recall tool's own traffic is never a hit, so it gets no vector either.
        rows = [(int(r[0]), str(r[1])) for r in conn.execute(
            f"SELECT id, substr(content, 1, {EMBED_CHARS}) FROM messages WHERE id IN ({marks})",
            batch) if not is_recall_traffic(str(r[1]))]
        if not rows:
            continue
        vectors = embedder.embed([text for _, text in rows])
        with conn:
            conn.executemany(
                "INSERT INTO embeddings(message_id, model, vector) VALUES (?,?,?)"
                " ON CONFLICT (message_id) DO UPDATE SET model = excluded.model,"
                " vector = excluded.vector",
                [(mid, embedder.model_name, vector_param(conn, vec))
                 for (mid, _), vec in zip(rows, vectors, strict=True)])
        written += len(rows)
    return written


@dataclass(slots=True)
class _TenantIndex:
    """SimHashes of one tenant's messages, with the scope of each row.

    ``codes`` is word-major (``codes[w]`` holds word ``w`` of every row) so the
    first pass reads two contiguous arrays.
    """

    watermark: int = 0
    ids: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    codes: npt.NDArray[np.uint64] = field(
        default_factory=lambda: np.zeros((CODE_WORDS, 0), np.uint64))
    projects: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    sessions: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    project_codes: dict[str, int] = field(default_factory=dict)
    session_codes: dict[str, int] = field(default_factory=dict)


def _hamming(codes: npt.NDArray[np.uint64], query: npt.NDArray[np.uint64],
             rows: IntArray | None) -> npt.NDArray[np.uint16]:
    """Hamming distance of ``query`` to each row (all rows when ``rows`` is None)."""
    total: npt.NDArray[np.uint16] | None = None
    for word in range(len(query)):
        column = codes[word] if rows is None else codes[word][rows]
        bits = np.bitwise_count(column ^ query[word]).astype(np.uint16)
        total = bits if total is None else total + bits
    assert total is not None
    return total


def _best(distance: npt.NDArray[np.uint16], keep: int) -> IntArray:
    """Positions of the ``keep`` smallest distances (ties cut in position order).

    Distances are small integers, so a histogram finds the cut-off: two linear
    passes instead of ``argpartition``, which took 7 ms on a million rows.
    """
    if len(distance) <= keep:
        return np.arange(len(distance), dtype=np.int64)
    cumulative = np.cumsum(np.bincount(distance))
    cut = int(np.searchsorted(cumulative, keep))  # the first distance reaching ``keep``
    below = np.flatnonzero(distance < cut)
    at = np.flatnonzero(distance == cut)[:keep - len(below)]
    return np.concatenate([below, at]).astype(np.int64)


class VectorIndex:
    """Cosine search over stored embeddings, one lazily loaded index per tenant.

    Not thread-safe; the search thread owns it. New embeddings are picked up
    incrementally (rows above the tenant's watermark) at the start of each search.
    """

    def __init__(self, model_name: str, dim: int, *, max_rows: int = MAX_INDEX_ROWS) -> None:
        self._model = model_name
        self._dim = dim
        self._max_rows = max_rows
        self._planes = _projections(dim)
        self._tenants: dict[str, _TenantIndex] = {}

    def simhash(self, vectors: FloatArray) -> npt.NDArray[np.uint64]:
        """384-bit SimHash of each row, word-major: shape (6, rows)."""
        return np.ascontiguousarray(sign_codes(vectors @ self._planes).T)

    def search(self, conn: Connection, query: FloatArray, *, tenant: str,
               project: str | None, session: str | None, k: int) -> dict[int, float]:
        """Up to ``k`` message ids of the scope with their cosine to ``query``."""
        index = self._refresh(conn, tenant)
        rows: IntArray | None = None  # None: every row of the tenant
        if project is not None or session is not None:
            mask = np.ones(len(index.ids), dtype=bool)
            for value, codes, column in ((project, index.project_codes, index.projects),
                                         (session, index.session_codes, index.sessions)):
                if value is None:
                    continue
                code = codes.get(value)
                if code is None:
                    return {}
                mask &= column == code
            rows = np.flatnonzero(mask)
        size = len(index.ids) if rows is None else len(rows)
        if size > EXACT_SCOPE_ROWS:
            qcode = self.simhash(query[None, :])[:, 0]
            coarse = _best(_hamming(index.codes[:COARSE_WORDS], qcode[:COARSE_WORDS], rows),
                           COARSE_CANDIDATES)
            rows = coarse if rows is None else rows[coarse]
            fine = _best(_hamming(index.codes, qcode, rows),
                         max(HAMMING_CANDIDATES, k))
            rows = rows[fine]
        candidates = index.ids if rows is None else index.ids[rows]
        scores = self.exact(conn, query, candidates.tolist())
        best = sorted(scores.items(), key=lambda kv: -kv[1])[:k]
        return dict(best)

    def exact(self, conn: Connection, query: FloatArray,
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

    def _refresh(self, conn: Connection, tenant: str) -> _TenantIndex:
        index = self._tenants.get(tenant)
        if index is None:
            self._evict_for_new_tenant()
            index = self._tenants[tenant] = _TenantIndex()
        while self._load_batch(conn, tenant, index):
            pass
        return index

    def _load_batch(self, conn: Connection, tenant: str, index: _TenantIndex) -> bool:
        """Add up to LOAD_BATCH rows above the watermark; ``False`` when none were left."""
        rows: list[tuple[Any, ...]] = conn.execute(
            "SELECT e.message_id, m.project, m.session, e.vector FROM embeddings e"
            " JOIN messages m ON m.id = e.message_id"
            " WHERE e.message_id > ? AND +m.tenant = ? AND e.model = ? ORDER BY e.message_id"
            f" LIMIT {LOAD_BATCH}", (index.watermark, tenant, self._model)).fetchall()
        if not rows:
            return False
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
        index.codes = np.concatenate([index.codes, self.simhash(vectors)], axis=1)
        index.projects = np.concatenate([index.projects, projects])
        index.sessions = np.concatenate([index.sessions, sessions])
        index.watermark = int(ids[-1])
        if len(index.ids) > self._max_rows:
            # Keep the most recent rows: old memories stay reachable through BM25.
            cut = len(index.ids) - self._max_rows
            index.ids, index.codes = index.ids[cut:], np.ascontiguousarray(index.codes[:, cut:])
            index.projects, index.sessions = index.projects[cut:], index.sessions[cut:]
        return len(rows) == LOAD_BATCH

    def _evict_for_new_tenant(self) -> None:
        total = sum(len(t.ids) for t in self._tenants.values())
        while self._tenants and total > self._max_rows // 2:
            victim = next(iter(self._tenants))  # insertion order: the oldest loaded
            total -= len(self._tenants.pop(victim).ids)
