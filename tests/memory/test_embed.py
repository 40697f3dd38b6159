"""The offline MiniLM embedder: shape, normalisation, and that it encodes meaning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.embed.embedder import as_blob, from_blob, load_embedder
from lore_gateway.memory.embed.vectors import (
    EXACT_SCOPE_ROWS,
    sign_codes,
    vector_param,
    vector_search,
)
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db

embedder = load_embedder()
pytestmark = pytest.mark.skipif(embedder is None, reason="embedding model not installed")


def test_unit_vectors_of_the_right_shape_in_input_order() -> None:
    assert embedder is not None
    texts = ["a much longer sentence about configuring the reverse proxy timeouts", "hi", ""]
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Batching and length-sorting do not change a text's vector.
    alone = embedder.embed([texts[0]])[0]
    assert np.allclose(alone, vectors[0], atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)


def test_similar_meaning_scores_higher() -> None:
    assert embedder is not None
    q, near, far = embedder.embed(["How do I reset my password?",
                                   "Steps to recover a forgotten login password",
                                   "The recipe needs two cups of flour"])
    assert float(q @ near) > 0.5 > float(q @ far)


def test_blob_round_trip_and_sign_codes() -> None:
    v = np.linspace(-1, 1, 384, dtype=np.float32)
    assert np.array_equal(from_blob(as_blob(v), 384), v)
    codes = sign_codes(np.stack([v, -v]))
    assert codes.shape == (2, 6)
    assert int(np.bitwise_count(codes[0] ^ codes[1]).sum()) == 384


@pytest.mark.usefixtures("database_url")
def test_open_embeds_messages_stored_while_the_model_was_absent(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    ident = Identity("tenant-a", "proj-x", "s1")
    texts = ["My puppy chewed through the sofa cushions again.",
             "The quarterly tax filing is due next Tuesday."]
    bm25_only = Memory.open(settings, embedder=None)
    try:
        for text in texts:
            assert bm25_only.submit_turn(TurnRecord(identity=ident, protocol="chat", model=None,
                                                    messages=(Message("user", text),),
                                                    created_at=1.7e9))
        bm25_only.flush(10)
    finally:
        bm25_only.close()

    def vectors() -> int:
        conn = db.connect(settings.database)
        try:
            return int(conn.execute("SELECT count(*) FROM embeddings").fetchone()[0])
        finally:
            conn.close()

    assert vectors() == 0
    memory = Memory.open(settings, embedder="auto")
    try:
        memory.flush(120)
        assert vectors() == 2
        # The backfilled vectors are searchable: no word in common with the answer.
        hits = memory.search_sync("dog destroyed furniture", identity=ident, limit=1).hits
        assert hits[0].content == texts[0]
    finally:
        memory.close()


@pytest.mark.usefixtures("database_url")
def test_a_scope_past_the_exact_limit_is_pre_ranked_and_still_finds_the_nearest(
        tmp_path: Path) -> None:
    """More rows than EXACT_SCOPE_ROWS: the SimHash passes must keep the true neighbours."""
    settings = Settings(data_dir=tmp_path, embeddings=False)
    memory = Memory.open(settings, embedder=None)
    rows = EXACT_SCOPE_ROWS + 2_000
    try:
        for i in range(0, rows, 2):
            ident = Identity("tenant-a", f"proj-{i % 4 // 2}", f"s{i // 100}")
            memory.submit_turn(TurnRecord(identity=ident, protocol="chat", model=None,
                                          messages=(Message("user", f"note {i}"),
                                                    Message("assistant", f"reply {i}")),
                                          created_at=1.7e9), wait=True)
        memory.flush(60)
    finally:
        memory.close()
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((rows, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    conn = db.connect(settings.database)
    try:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages ORDER BY id")]
        with conn:
            conn.executemany("INSERT INTO embeddings(message_id, model, vector) VALUES (?,?,?)",
                             [(mid, "m", vector_param(conn, v))
                              for mid, v in zip(ids, vectors, strict=True)])
        index = vector_search(conn, "m", 384)
        for target in (7, 1_234, rows - 1):
            query = vectors[target] + 0.6 * rng.standard_normal(384).astype(np.float32) / 20
            query /= np.linalg.norm(query)
            found = index.search(conn, query, tenant="tenant-a", project=None, session=None,
                                 k=10)
            assert max(found, key=lambda mid: found[mid]) == ids[target]
        # A project scope only returns that project's rows.
        project_ids = {int(r[0]) for r in conn.execute(
            "SELECT id FROM messages WHERE project = 'proj-1'")}
        found = index.search(conn, vectors[2], tenant="tenant-a", project="proj-1",
                             session=None, k=50)
        assert found and set(found) <= project_ids and ids[2] in found
    finally:
        conn.close()
