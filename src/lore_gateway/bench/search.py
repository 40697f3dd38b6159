"""``lore bench search``: insert throughput and search latency on a synthetic corpus.

The corpus is N messages written through the proxy's write path
(``Memory.submit_turn``, two messages per turn) into a throw-away database:
one tenant, sessions of 200 messages, 50 sessions per project. Text is drawn
from a Zipf-distributed synthetic vocabulary, so common words are common (which
is what makes BM25 OR-queries expensive) and rare words are rare.

Vectors: embedding a million messages with MiniLM would take hours of CPU, so
the benchmark stores *synthetic* unit vectors (topic centroid + noise) directly
in ``embeddings``. Search cost does not depend on what the vectors mean; the
query itself is embedded with the real model, so hybrid latency includes it.

Queries are 3–5 words taken from random stored messages plus filler words, so
every query has matches, and are run with scopes ``project`` and ``all``.

``backend="postgres"`` runs the same corpus and queries on Postgres: on the server
``database_url`` names (an empty database; it is left filled), or else on a
private throw-away server (pgserver, as the tests start), with the same seed, so
the two backends' figures compare directly.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson

from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role
from lore_gateway.storage.base import Connection, Database

if TYPE_CHECKING:
    from lore_gateway.memory.embed.embedder import Embedder

TENANT = "bench-search"
SESSION_MESSAGES = 200
SESSIONS_PER_PROJECT = 50
VOCABULARY = 50_000
QUERY_FILLER = ("how", "did", "we", "the", "what", "about", "fix")
TOPICS = 256

# Turns allowed in the writer's queue before the benchmark waits (its bound is 10,000).
BACKLOG = 5_000

Progress = Callable[[str, int, int], None]


@dataclass(slots=True)
class SearchBenchReport:
    backend: str = "sqlite"
    messages: int = 0
    insert_s: float = 0.0
    vectors_s: float = 0.0
    vector_index_s: float = 0.0
    vector_index_mb: int = 0
    db_bytes: int = 0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    # Postgres, scope all: per query, how many of the exact top 10 the approximate
    # (HNSW) path also returned, for the vector candidates and the hybrid hits.
    overlap: dict[str, list[float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backend": self.backend,
            "messages": self.messages,
            "insert_s": round(self.insert_s, 2),
            "insert_msgs_per_s": round(self.messages / self.insert_s) if self.insert_s else None,
            "vectors_s": round(self.vectors_s, 2),
            "vector_index_s": round(self.vector_index_s, 2),
            "vector_index_mb": self.vector_index_mb,
            "db_mb": round(self.db_bytes / 1e6, 1),
        }
        for name, values in sorted(self.latencies.items()):
            ordered = sorted(values)
            out[name] = {
                "p50_ms": round(statistics.median(ordered), 2),
                "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
                "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
                "n": len(ordered),
            }
        for name, values in sorted(self.overlap.items()):
            out[f"overlap_at_10_{name}"] = {
                "mean": round(statistics.fmean(values), 4) if values else None,
                "min": round(min(values), 4) if values else None, "n": len(values)}
        return out


def _vocabulary(rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(3, 10, size=VOCABULARY)
    words = {"".join(rng.choice(letters, size=n)) for n in lengths}
    return sorted(words)


def _texts(rng: np.random.Generator, vocab: list[str], count: int) -> list[str]:
    # Zipf(1.1) ranks, clipped to the vocabulary; 8–60 words per message.
    ranks = np.minimum(rng.zipf(1.1, size=count * 40), len(vocab)) - 1
    lengths = rng.integers(8, 60, size=count)
    out, pos = [], 0
    for n in lengths:
        take = ranks[pos:pos + n] if pos + n <= len(ranks) else rng.integers(0, len(vocab), n)
        out.append(" ".join(vocab[i] for i in take))
        pos += n
    return out


def _identity(index: int) -> Identity:
    session = index // SESSION_MESSAGES
    return Identity(TENANT, f"project-{session // SESSIONS_PER_PROJECT}", f"session-{session}")


Backend = Literal["sqlite", "postgres"]


@contextmanager
def _database_url(backend: Backend, database_url: str | None) -> Iterator[str | None]:
    """The URL to benchmark on: None for SQLite (the data dir's file), the given
    Postgres, or a private pgserver database that goes away afterwards."""
    if backend == "sqlite" or database_url is not None:
        yield database_url
        return
    try:
        from lore_gateway.testing.postgres import PostgresForTests
    except ImportError as exc:  # pragma: no cover - pgserver is a dev dependency
        raise RuntimeError("no Postgres to benchmark on: pass --database-url "
                           "postgresql://… (an empty database) or install pgserver") from exc
    server = PostgresForTests()
    try:
        url = server.fresh_url()
        yield url
        from lore_gateway.storage.target import close_shared

        close_shared(url)
    finally:
        server.close()


def run(messages: int = 100_000, *, queries: int = 200, seed: int = 7,
        progress: Progress | None = None, backend: Backend = "sqlite",
        database_url: str | None = None) -> SearchBenchReport:
    with tempfile.TemporaryDirectory(prefix="lore-bench-search-") as tmp, \
            _database_url(backend, database_url) as url:
        return _run(messages, queries, seed, progress, Path(tmp), url)


def _run(messages: int, queries: int, seed: int, progress: Progress | None, tmp: Path,
         url: str | None) -> SearchBenchReport:
    from lore_gateway.memory.embed.embedder import load_embedder
    from lore_gateway.memory.search.searcher import Searcher
    from lore_gateway.memory.service import Memory
    from lore_gateway.storage import db

    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    settings = Settings(data_dir=tmp, embeddings=False, database_url=url)
    report = SearchBenchReport(backend=settings.database.backend, messages=messages)
    memory = Memory.open(settings, embedder=None)
    sample: list[tuple[int, str]] = []
    try:
        started = time.perf_counter()
        chunk = 10_000
        for start in range(0, messages, chunk):
            texts = _texts(rng, vocab, min(chunk, messages - start))
            for i in range(0, len(texts), 2):
                index = start + i
                pair = texts[i:i + 2]
                roles: tuple[Role, ...] = ("user", "assistant") if len(pair) == 2 else ("user",)
                record = TurnRecord(
                    identity=_identity(index), protocol="bench:search", model=None,
                    messages=tuple(Message(r, t) for r, t in zip(roles, pair, strict=True)),
                    created_at=1.7e9 + index)
                # The benchmark may wait for the writer; the proxy never does.
                while memory.queue_depth > BACKLOG:
                    time.sleep(0.005)
                if not memory.submit_turn(record):
                    raise RuntimeError("the memory writer refused a turn; see the log")
            if len(sample) < queries:
                sample.append((start, texts[int(rng.integers(0, len(texts)))]))
            if progress is not None:
                progress("insert", start + len(texts), messages)
        memory.flush()
        report.insert_s = time.perf_counter() - started
    finally:
        memory.close()

    postgres = settings.database.backend == "postgres"
    started = time.perf_counter()
    if postgres:  # bulk load first, then build the HNSW index (as a restore does)
        _execute(settings.database, "DROP INDEX IF EXISTS embeddings_hnsw")
    _store_synthetic_vectors(settings.database, rng, progress)
    report.vectors_s = time.perf_counter() - started
    if postgres:
        started = time.perf_counter()
        report.vector_index_mb = _build_hnsw(settings.database,
                                             settings.database_index_memory_mb)
        report.vector_index_s = time.perf_counter() - started

    embedder = load_embedder()
    factory = db.conn_factory(settings.database)
    searchers = {"bm25": Searcher(factory, None)}
    if embedder is not None:
        searchers["hybrid"] = Searcher(factory, embedder)
    query_set = _queries(rng, sample, queries)
    for name, searcher in searchers.items():
        for scope in ("project", "all"):
            timings = report.latencies.setdefault(f"{name}_{scope}", [])
            # Warm-up: the first hybrid search loads the tenant's vector index.
            searcher.search(query_set[0][1], tenant=TENANT, project=query_set[0][0].project,
                            session=query_set[0][0].session, scope=scope)
            for done, (ident, text) in enumerate(query_set, start=1):
                t0 = time.perf_counter()
                searcher.search(text, tenant=TENANT, project=ident.project,
                                session=ident.session, scope=scope, limit=10)
                timings.append((time.perf_counter() - t0) * 1000)
                # Outside the timed span; every 10th query keeps the cost negligible.
                if progress is not None and (done % 10 == 0 or done == len(query_set)):
                    progress(f"search {name} {scope}", done, len(query_set))
    if postgres and embedder is not None:
        _measure_overlap(report, factory, embedder, query_set)
    report.db_bytes = _size(settings.database, tmp)
    return report


def _measure_overlap(report: SearchBenchReport, factory: Callable[[], Connection],
                     embedder: Embedder, query_set: list[tuple[Identity, str]]) -> None:
    """Scope all on Postgres: the approximate top 10 against the exact one."""
    from lore_gateway.memory.search.searcher import Searcher
    from lore_gateway.storage.pgvectors import PgVectors

    conn = factory()
    try:
        approximate = PgVectors(embedder.model_name)
        exact = PgVectors(embedder.model_name, approximate=False)
        for _ident, text in query_set:
            qvec = embedder.embed([text])[0]
            got, want = (paths.search(conn, qvec, tenant=TENANT, project=None, session=None,
                                      k=10) for paths in (approximate, exact))
            report.overlap.setdefault("vectors", []).append(
                len(set(got) & set(want)) / max(len(want), 1))
        # The query embeddings above are of random letters, far from every stored
        # vector (the hardest case for HNSW); a real query resembles stored text, so
        # also: a stored vector plus noise (cosine ~0.9 to it) as the query.
        rng = np.random.default_rng(11)
        for (stored,) in conn.execute(
                "SELECT vector::text FROM embeddings ORDER BY message_id"
                f" OFFSET {int(rng.integers(0, 1000))} LIMIT ?", (len(query_set),)):
            near = np.array(orjson.loads(str(stored)), dtype=np.float32)
            near += rng.standard_normal(len(near), dtype=np.float32) * 0.025
            near /= np.linalg.norm(near)
            got, want = (paths.search(conn, near, tenant=TENANT, project=None, session=None,
                                      k=10) for paths in (approximate, exact))
            report.overlap.setdefault("vectors_near_stored", []).append(
                len(set(got) & set(want)) / max(len(want), 1))
    finally:
        conn.close()
    searchers = {}
    for name, vectors in (("approximate", PgVectors(embedder.model_name)),
                          ("exact", PgVectors(embedder.model_name, approximate=False))):
        searcher = Searcher(factory, embedder)
        searcher.search("warm up", tenant=TENANT, project="", session="", scope="all")
        searcher._vectors = vectors  # the bench compares the two paths on one store
        searchers[name] = searcher
    for ident, text in query_set:
        hits = {name: [h.ref for h in searcher.search(
            text, tenant=TENANT, project=ident.project, session=ident.session, scope="all",
            limit=10).hits] for name, searcher in searchers.items()}
        report.overlap.setdefault("hybrid", []).append(
            len(set(hits["approximate"]) & set(hits["exact"])) / max(len(hits["exact"]), 1))


def _build_hnsw(database: Database, cap_mb: int) -> int:
    """The HNSW index over the loaded vectors, its memory sized as the migration
    sizes it; returns that ``maintenance_work_mem`` in MB."""
    from lore_gateway.storage import db
    from lore_gateway.storage.schema_pg import HNSW_INDEX, prepare_hnsw_build

    conn = db.connect(database)
    try:
        _, mb = prepare_hnsw_build(conn, cap_mb, local=False)
        conn.execute(HNSW_INDEX)
        return mb
    finally:
        conn.close()


def _execute(database: Database, *statements: str) -> None:
    from lore_gateway.storage import db

    conn = db.connect(database)
    try:
        for sql in statements:
            conn.execute(sql)
    finally:
        conn.close()


def _size(database: Database, tmp: Path) -> int:
    from lore_gateway.storage import db

    if database.backend == "sqlite":
        return sum(p.stat().st_size for p in tmp.glob("lore.db*"))
    conn = db.connect(database)
    try:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()


def _queries(rng: np.random.Generator, sample: list[tuple[int, str]],
             count: int) -> list[tuple[Identity, str]]:
    out = []
    for i in range(count):
        start, text = sample[i % len(sample)]
        words = text.split()
        picked = list(rng.choice(words, size=min(len(words), int(rng.integers(3, 6))),
                                 replace=False))
        picked.insert(int(rng.integers(0, len(picked) + 1)),
                      QUERY_FILLER[int(rng.integers(0, len(QUERY_FILLER)))])
        out.append((_identity(start), " ".join(str(w) for w in picked)))
    return out


def _store_synthetic_vectors(database: Database, rng: np.random.Generator,
                             progress: Progress | None) -> None:
    """One unit vector per message: a random topic centroid plus noise."""
    from lore_gateway.memory.embed.embedder import MODEL_NAME
    from lore_gateway.memory.embed.vectors import vector_param
    from lore_gateway.storage import db

    centroids = rng.standard_normal((TOPICS, 384)).astype(np.float32)
    conn = db.connect(database)
    try:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages ORDER BY id")]
        batch = 20_000
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            vectors = centroids[rng.integers(0, TOPICS, len(chunk))] + rng.standard_normal(
                (len(chunk), 384)).astype(np.float32) * 0.8
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            with conn:
                conn.executemany(
                    "INSERT INTO embeddings(message_id, model, vector) VALUES (?,?,?)",
                    [(mid, MODEL_NAME, vector_param(conn, vec))
                     for mid, vec in zip(chunk, vectors, strict=True)])
            if progress is not None:
                progress("vectors", start + len(chunk), len(ids))
    finally:
        conn.close()
