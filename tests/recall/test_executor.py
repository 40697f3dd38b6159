"""The recall executor against a real (temporary) memory store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.records import Identity, TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message
from lore_gateway.recall.core.executor import EXECUTION_FAILED, RecallExecutor
from lore_gateway.recall.core.tool import RecallArgs

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
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
