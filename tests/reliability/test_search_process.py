"""Recall searches run in their own process, bounded and with a timeout (issue 10 point 3)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.search.process import SearchProcess
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.storage.errors import MemoryUnavailable, SearchTimeout

IDENT = Identity("tenant-a", "proj", "sess")

# A child's first search includes its start (a new interpreter, imports, the
# database); on a loaded CI machine that has taken longer than the default 10 s.
COLD_START_S = 60.0


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    data = tmp_path_factory.mktemp("search-process")
    mem = Memory.open(Settings(data_dir=data, embeddings=False), embedder=None)
    for i, text in enumerate(["the quokka migration runs at night", "lunch was pasta",
                              "quokka tests are flaky on tuesdays"]):
        mem.submit_turn(TurnRecord(identity=IDENT, protocol="chat", model=None,
                                   created_at=time.time() + i,
                                   messages=(Message("user", text),)), wait=True)
    mem.flush(timeout=10)
    yield mem
    mem.close()


async def test_a_search_in_the_process_finds_what_the_in_process_search_finds(
    memory: Memory,
) -> None:
    here = memory.search_sync("quokka", identity=IDENT, scope="all")
    there = await memory.search("quokka", identity=IDENT, scope="all")
    assert [h.ref for h in there.hits] == [h.ref for h in here.hits]
    assert all("quokka" in h.content for h in there.hits[:2])
    assert memory._searches is not None
    assert os.getpid() not in memory._searches.pids
    # Without embeddings there is no embedding process to host searches: one worker.
    assert len(memory._searches.pids) == max(1, memory.settings.search_workers)


async def test_a_search_over_its_timeout_raises_search_timeout(memory: Memory) -> None:
    slow = SearchProcess(memory.settings.db_path, embeddings=False, timeout=1e-9)
    try:
        with pytest.raises(SearchTimeout, match="longer than"):
            await slow.search("quokka", tenant=IDENT.tenant, project=IDENT.project,
                              session=IDENT.session, scope="all", limit=5)
    finally:
        slow.close()


async def test_searches_beyond_the_bound_fail_fast(memory: Memory) -> None:
    full = SearchProcess(memory.settings.db_path, embeddings=False, max_in_flight=0)
    with pytest.raises(MemoryUnavailable, match="overloaded"):
        await full.search("quokka", tenant=IDENT.tenant, project=IDENT.project,
                          session=IDENT.session, scope="all", limit=5)
    full.close()


async def test_a_dead_search_process_is_replaced(memory: Memory) -> None:
    searches = SearchProcess(memory.settings.db_path, embeddings=False, timeout=COLD_START_S)
    try:
        args = {"tenant": IDENT.tenant, "project": IDENT.project, "session": IDENT.session,
                "scope": "all", "limit": 5}
        assert (await searches.search("quokka", **args)).hits
        (pid,) = searches.pids
        os.kill(pid, signal.SIGKILL)
        failed = 0
        for _ in range(50):  # at most the search the death caught fails
            try:
                result = await searches.search("quokka", **args)
            except MemoryUnavailable:
                failed += 1
                continue
            break
        assert result.hits
        assert failed <= 1
        assert searches.restarts == 1
        assert searches.pids != [pid]
    finally:
        searches.close()


async def test_the_first_searches_arriving_together_all_get_their_own_answer(
    memory: Memory,
) -> None:
    searches = SearchProcess(memory.settings.db_path, embeddings=False, workers=2,
                             timeout=COLD_START_S)
    try:
        queries = ["quokka", "pasta", "tuesdays", "migration"] * 5
        results = await asyncio.gather(*(searches.search(
            q, tenant=IDENT.tenant, project=IDENT.project, session=IDENT.session,
            scope="all", limit=5) for q in queries))
        for query, result in zip(queries, results, strict=True):
            assert query in result.hits[0].content
        assert searches.restarts == 0
    finally:
        searches.close()
