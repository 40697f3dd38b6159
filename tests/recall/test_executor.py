"""The recall executor against a real (temporary) memory store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.search.hits import SearchResult
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.recall.core.executor import (
    EXECUTION_FAILED,
    TIMED_OUT,
    UNAVAILABLE,
    RecallExecutor,
    SearchGate,
)
from lore_gateway.recall.core.tool import RecallArgs

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    mem.submit_turn(
        TurnRecord(
            identity=IDENT,
            protocol="responses",
            model="m",
            messages=(
                Message("user", "Our deploy target is the blue cluster in eu-west-3."),
                Message("assistant", "Noted: blue cluster, eu-west-3."),
            ),
            created_at=time.time(),
        )
    )
    mem.flush(10)
    yield mem
    mem.close()


def _first_ref(memory: Memory) -> str:
    return memory.session_messages(IDENT.tenant, IDENT.session)[0].ref


async def test_detail_returns_stored_text_and_private_coverage(memory: Memory) -> None:
    ref = _first_ref(memory)
    outcome = await RecallExecutor(memory, IDENT).run(RecallArgs(id=ref))
    assert "blue cluster in eu-west-3" in outcome.text
    assert [c.identity for c in outcome.coverage] == [ref]


async def test_detail_of_another_tenant_finds_nothing(memory: Memory) -> None:
    ref = _first_ref(memory)
    other = Identity(tenant="tenant-b", project="/p", session="s1")
    outcome = await RecallExecutor(memory, other).run(RecallArgs(id=ref))
    assert "blue cluster" not in outcome.text
    assert outcome.coverage == ()


async def test_batch_reports_outcome_per_id(memory: Memory) -> None:
    ref = _first_ref(memory)
    outcome = await RecallExecutor(memory, IDENT).run(RecallArgs(ids=(ref, "t:999999")))
    assert outcome.text.startswith("## Recall Details")
    assert f"### Detail: {ref}\nOutcome: delivered" in outcome.text
    assert "### Detail: t:999999\nOutcome: unavailable" in outcome.text


async def test_memory_failure_becomes_the_failure_text(memory: Memory) -> None:
    memory.close()
    outcome = await RecallExecutor(memory, IDENT).run(RecallArgs(query="deploy"))
    assert outcome.text == EXECUTION_FAILED and outcome.failed


class _StuckMemory:
    """A memory whose searches never finish until released (event-based)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def search(self, query: str, **_: Any) -> SearchResult:
        self.started.set()
        await self.release.wait()
        return SearchResult(query, "all", [], 0)

    def render(self, result: SearchResult, budget_chars: int = 12_000) -> str:
        return ""

    async def detail(self, ref: str, **_: Any) -> str:
        await self.release.wait()
        return ""


async def test_a_search_that_does_not_answer_in_time_is_a_timeout_failure() -> None:
    memory = _StuckMemory()
    executor = RecallExecutor(memory, IDENT, SearchGate(timeout=0.05))
    outcome = await executor.run(RecallArgs(query="deploy"))
    assert outcome.failed and outcome.failure == "recall_timeout"
    assert outcome.text == TIMED_OUT and outcome.coverage == ()


async def test_searches_beyond_the_bound_fail_fast_as_unavailable() -> None:
    """The gate admits ``limit`` searches; the next one is refused at
    once (no queueing without bound), and the admitted ones still finish."""
    memory = _StuckMemory()
    gate = SearchGate(limit=2, timeout=30)
    executor = RecallExecutor(memory, IDENT, gate)
    admitted = [asyncio.create_task(executor.run(RecallArgs(query=f"q{i}"))) for i in range(2)]
    await asyncio.wait_for(memory.started.wait(), 10)  # both are in flight
    assert gate.in_flight == 2
    refused = await executor.run(RecallArgs(query="one too many"))
    assert refused.failed and refused.failure == "recall_unavailable"
    assert refused.text == UNAVAILABLE
    memory.release.set()
    done = await asyncio.gather(*admitted)
    assert [o.failed for o in done] == [False, False]
    assert gate.in_flight == 0


async def test_a_closed_memory_is_an_execution_failure(memory: Memory) -> None:
    memory.close()
    outcome = await RecallExecutor(memory, IDENT).run(RecallArgs(query="deploy"))
    assert outcome.failure == "recall_execution"
