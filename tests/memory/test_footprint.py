"""Serving memory (issue 14 point 3): one copy of the weights where they are used."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from lore_gateway import heap
from lore_gateway.config import Settings
from lore_gateway.memory.embed.embedder import model_info
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message

IDENT = Identity("tenant-a", "proj", "sess")


@pytest.mark.usefixtures("database_url")
async def test_the_gateway_searches_with_vectors_without_loading_the_model(
    tmp_path: Path,
) -> None:
    assert model_info() is not None
    memory = Memory.open(Settings(data_dir=tmp_path, embeddings=True))
    try:
        memory.submit_turn(TurnRecord(identity=IDENT, protocol="chat", model=None,
                                      created_at=time.time(),
                                      messages=(Message("user", "the quokka migration"),)),
                           wait=True)
        memory.flush(timeout=60)
        result = await memory.search("quokka", identity=IDENT, scope="all")
        assert memory.embeddings
        assert [h.content for h in result.hits] == ["the quokka migration"]
        assert memory._embedder == "lazy"  # the search process loaded it, this one did not
        assert memory.search_sync("quokka", identity=IDENT).hits  # loads it here
        assert memory._embedder != "lazy"
    finally:
        memory.close()


def test_trim_and_process_name_work_on_glibc() -> None:
    code = ("from lore_gateway import heap; b = bytearray(64 << 20); del b; "
            "heap.name_process('lore-probe'); print(heap.available(), "
            "open('/proc/self/comm').read().strip())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(heap.available()), "lore-probe"]
    assert heap.available() == sys.platform.startswith("linux")


@pytest.mark.usefixtures("database_url")
def test_the_footprint_bench_reads_every_process_of_the_gateway_tree() -> None:
    from lore_gateway.bench.footprint import run

    result = run(turns=4, recall_every=2, embeddings=False)
    assert result["failed"] == 0
    assert result["stored_turns"] == 4 + 2  # and the two warm-up turns
    after = result["after"]
    names = [p["name"] for p in after["processes"]]
    assert "lore-search" in names  # the recalls searched in their own process
    assert "lore-embed" not in names  # embeddings off: no embedder
    assert after["rss_mib"] == round(sum(p["rss_mib"] for p in after["processes"]), 1)
    assert all(0 < p["pss_mib"] <= p["rss_mib"] <= p["peak_rss_mib"]
               for p in after["processes"])


def test_a_cached_recall_holds_no_more_than_its_bytes() -> None:
    from lore_gateway.memory.store.anchor_store import StoredRecall

    entry = StoredRecall.from_messages(
        anchor_id="a1", protocol="responses", marker=None, call_id="call_1",
        arguments='{"query":"what did we decide"}', position=0, context_id="c",
        assistant={"type": "function_call", "call_id": "call_1", "name": "recall"},
        tool_result={"type": "function_call_output", "output": "- (user) the quokka"})
    assert entry.size >= len(entry.assistant_json) + len(entry.result_json)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [StoredRecall.from_messages(
            anchor_id=f"a{i}", protocol="responses", marker=None, call_id="call_1",
            arguments="{}", position=i, context_id="c", assistant={"n": i},
            tool_result={"output": "x"}) for i in range(200)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    # orjson's own result keeps its 4 KiB write buffer behind a short length
    assert held < 1024


def _package_embedder() -> Any:
    """The pipeline over the package's graph as it ships: what stored the vectors
    before the weights stayed int8."""
    import onnxruntime as ort

    from lore_gateway.memory.embed.embedder import Embedder, session_options, tokenizer_path

    info = model_info()
    assert info is not None
    package = Embedder(info.path, tokenizer_path())
    package._session = ort.InferenceSession(str(info.path), sess_options=session_options(1),
                                            providers=["CPUExecutionProvider"])
    return package


# Texts a memory stores (never an empty one: turn_rows.prepare_turn drops those).
TEXTS = ["the quokka migration runs at night", "x",
         "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
         "def flush(self, timeout: float) -> bool:\n    return self._done.wait(timeout)",
         "a longer paragraph " * 60]  # past the 256-token truncation


def test_the_int8_table_rewrite_keeps_every_vector_bit_identical(tmp_path: Path) -> None:
    import numpy as np

    from lore_gateway.memory.embed.embedder import Embedder, tokenizer_path
    from lore_gateway.memory.embed.onnx_int8 import Rewrites, keep_int8

    info = model_info()
    assert info is not None
    rewritten, done = keep_int8(info.path.read_bytes(), matmuls=False)
    assert done == Rewrites(tables=2)  # the word- and position-embedding tables
    assert keep_int8(rewritten, matmuls=False) == (rewritten, Rewrites())  # nothing left
    (tmp_path / "tables.onnx").write_bytes(rewritten)
    tables_only = Embedder(info.path, tokenizer_path())
    tables_only._session = _package_embedder()._session.__class__(
        str(tmp_path / "tables.onnx"), providers=["CPUExecutionProvider"])
    texts = [*TEXTS, ""]
    assert np.array_equal(tables_only.embed(texts), _package_embedder().embed(texts))


def test_the_int8_matmuls_keep_vectors_within_cosine_0999_of_the_stored_ones() -> None:
    """The embedder computes its MatMuls in int8: vectors move a little, so
    vectors stored before it must stay comparable (docs/search.md)."""
    import numpy as np

    from lore_gateway.memory.embed.embedder import Embedder, tokenizer_path
    from lore_gateway.memory.embed.onnx_int8 import Rewrites, keep_int8

    info = model_info()
    assert info is not None
    rewritten, done = keep_int8(info.path.read_bytes())
    assert done == Rewrites(tables=2, matmuls=36)  # every weight of the encoder
    assert keep_int8(rewritten) == (rewritten, Rewrites())
    ours = Embedder(info.path, tokenizer_path()).embed(TEXTS)
    before = _package_embedder().embed(TEXTS)
    cosines = (ours * before).sum(axis=1)
    assert cosines.min() >= 0.999, cosines
    assert not np.array_equal(ours, before)  # the int8 compute is in use
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    again = Embedder(info.path, tokenizer_path()).embed(TEXTS[::-1])[::-1]
    assert np.array_equal(ours, again)  # a text's vector does not depend on the others


@pytest.mark.usefixtures("database_url")
async def test_searches_run_in_the_embedding_process_and_survive_its_death(
    tmp_path: Path,
) -> None:
    """One model process (LORE_SEARCH_WORKERS=0, the default): the embedding
    process answers searches; killed, it is replaced, and both go on."""
    import os
    import signal

    from lore_gateway.storage.errors import MemoryUnavailable

    memory = Memory.open(Settings(data_dir=tmp_path, embeddings=True))
    try:
        def store(text: str) -> None:
            memory.submit_turn(TurnRecord(identity=IDENT, protocol="chat", model=None,
                                          created_at=time.time(),
                                          messages=(Message("user", text),)), wait=True)
            memory.flush(timeout=60)

        store("the quokka migration runs at night")
        worker = memory._embedding_worker
        assert worker is not None and worker.flush(timeout=120)
        here = memory.search_sync("nocturnal marsupial move", identity=IDENT)
        there = await memory.search("nocturnal marsupial move", identity=IDENT)
        assert [(h.ref, h.score) for h in there.hits] == [(h.ref, h.score) for h in here.hits]
        assert memory._searches is not None
        (pid,) = memory._searches.pids
        assert pid == worker._process.pid  # no search process of its own
        os.kill(pid, signal.SIGKILL)
        failed = 0
        for _ in range(50):  # at most the search the death caught fails
            try:
                result = await memory.search("quokka", identity=IDENT)
            except MemoryUnavailable:
                failed += 1
                continue
            break
        assert result.hits and failed <= 1
        assert memory._searches.pids == [worker._process.pid] != [pid]
        assert worker.restarts == 1
        before = worker.embedded
        store("the wombat burrow needs a new door")  # the new child embeds again
        assert worker.flush(timeout=120) and worker.embedded == before + 1
    finally:
        memory.close()


@pytest.mark.usefixtures("database_url")
def test_the_gateway_process_never_imports_numpy_or_the_search_stack(tmp_path: Path) -> None:
    """Searching through the embedding process, the gateway unpickles the hits
    (memory/search/hits.py) without importing numpy, onnxruntime or memory/search/searcher.py."""
    script = f"""
import asyncio, sys, time
from pathlib import Path
from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message
if __name__ == "__main__":
    ident = Identity("t", "p", "s")
    memory = Memory.open(Settings(data_dir=Path({str(tmp_path)!r})))
    memory.submit_turn(TurnRecord(identity=ident, protocol="chat", model=None,
                                  created_at=time.time(),
                                  messages=(Message("user", "the quokka migration"),)),
                       wait=True)
    memory.flush(timeout=60)
    hits = asyncio.run(memory.search("quokka", identity=ident)).hits
    searcher = "lore_gateway.memory.search.searcher"
    print(len(hits), *sorted(m for m in ("numpy", "onnxruntime", searcher) if m in sys.modules))
    memory.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1"]


def test_the_shipped_simhash_planes_are_the_seeded_ones() -> None:
    """memory/model/simhash_planes.f32 saves the searching process numpy.random; the
    index must hash exactly as with the generated planes."""
    import numpy as np

    from lore_gateway.memory.embed.vectors import CODE_WORDS, _projections

    generated = np.random.default_rng(384).standard_normal(
        (384, CODE_WORDS * 64)).astype(np.float32)
    shipped = _projections(384)
    assert shipped.dtype == np.float32 and shipped.flags.writeable
    assert np.array_equal(shipped, generated)


@pytest.mark.usefixtures("database_url")
def test_the_helper_processes_start_without_multiprocessing(tmp_path: Path,
                                                             db_backend: str) -> None:
    """No resource tracker beside the gateway, and the embedding process (which
    searches) maps neither asyncio nor numpy.random: RSS we measured away
    (docs/benchmarks.md, "Memory"; on Postgres its driver brings asyncio). The
    storage and embedding processes still write and search."""
    script = f"""
import asyncio, os, time
from pathlib import Path
from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message

ident = Identity("t", "p", "s")
memory = Memory.open(Settings(data_dir=Path({str(tmp_path)!r}), embeddings=True),
                     turn_process=True)
memory.submit_turn(TurnRecord(identity=ident, protocol="chat", model=None,
                              created_at=time.time(),
                              messages=(Message("user", "the quokka migration"),)),
                   wait=True)
memory.flush(timeout=60)
assert memory._embedding_worker.flush(timeout=120)
hits = asyncio.run(memory.search("quokka migration", identity=ident)).hits
children = Path(f"/proc/{{os.getpid()}}/task/{{os.getpid()}}/children").read_text().split()
for child in children:
    cmdline = Path(f"/proc/{{child}}/cmdline").read_bytes()
    maps = Path(f"/proc/{{child}}/maps").read_text()
    name = Path(f"/proc/{{child}}/comm").read_text().strip()
    print(name, b"resource_tracker" in cmdline, "/_asyncio." in maps, "numpy/random" in maps)
print("hits", len(hits))
memory.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    asyncio_in_driver = db_backend == "postgres"
    assert sorted(out.stdout.splitlines()) == [
        "hits 1", f"lore-embed False {asyncio_in_driver} False",
        f"lore-store False {asyncio_in_driver} False"]
