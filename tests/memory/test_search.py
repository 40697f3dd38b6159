"""Search over the real store: scopes, tenant isolation, ranking signals, hybrid vectors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.embed import load_embedder
from lore_gateway.memory.query import parse_query
from lore_gateway.memory.records import Identity, TurnRecord
from lore_gateway.memory.service import Memory
from lore_gateway.protocols.common import Message, Role

ALICE = Identity("tenant-a", "proj-x", "s1")


def _turn(ident: Identity, *pairs: tuple[Role, str], at: float = 1.7e9) -> TurnRecord:
    return TurnRecord(identity=ident, protocol="responses", model="m",
                      messages=tuple(Message(r, t) for r, t in pairs), created_at=at)


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    yield mem
    mem.close()


def _store(memory: Memory, *turns: TurnRecord) -> None:
    for t in turns:
        assert memory.submit_turn(t)
    memory.flush(10)


def test_scopes_and_tenant_isolation(memory: Memory) -> None:
    other_session = Identity("tenant-a", "proj-x", "s2")
    other_project = Identity("tenant-a", "proj-y", "s3")
    other_tenant = Identity("tenant-b", "proj-x", "s1")
    _store(memory,
           _turn(ALICE, ("user", "the flaky websocket reconnect test")),
           _turn(other_session, ("user", "websocket reconnect backoff tuned")),
           _turn(other_project, ("user", "websocket reconnect in the mobile app")),
           _turn(other_tenant, ("user", "websocket reconnect secret plan of tenant b")))

    def sessions(scope: str, ident: Identity = ALICE) -> set[str]:
        hits = memory.search_sync("websocket reconnect", identity=ident, scope=scope).hits
        return {h.session for h in hits}

    assert sessions("session") == {"s1"}
    assert sessions("project") == {"s1", "s2"}
    assert sessions("all") == {"s1", "s2", "s3"}
    # Tenant b sees only its own row, in every scope, and never tenant a's text.
    for scope in ("session", "project", "all"):
        hits = memory.search_sync("websocket reconnect", identity=other_tenant, scope=scope).hits
        assert [h.content for h in hits] == ["websocket reconnect secret plan of tenant b"]


def test_hits_carry_refs_that_detail_resolves(memory: Memory) -> None:
    _store(memory, _turn(ALICE, ("user", "where is the parser?"),
                         ("assistant", "The SSE parser lives in src/lore_gateway/sse.py")))
    result = memory.search_sync("SSE parser location", identity=ALICE)
    assert result.hits[0].content.startswith("The SSE parser")
    assert result.hits[0].ref.startswith("t:")
    assert result.hits[0].score == 1.0
    detail = memory.detail_sync(result.hits[0].ref, tenant=ALICE.tenant)
    assert "src/lore_gateway/sse.py" in detail
    # Another tenant cannot read it by id.
    assert "No entry found" in memory.detail_sync(result.hits[0].ref, tenant="tenant-b")


def test_answer_is_found_through_the_question_it_answers(memory: Memory) -> None:
    """context_fts: the reply shares no words with the query, its predecessor does."""
    _store(memory,
           _turn(ALICE, ("user", "Which database engine did we pick for the ledger service?"),
                 ("assistant", "Postgres 16, with logical replication to the warehouse.")),
           _turn(ALICE, ("user", "unrelated: rename the CI job"), ("assistant", "Done.")))
    hits = memory.search_sync("ledger service database engine", identity=ALICE).hits
    contents = [h.content for h in hits]
    assert contents[0].startswith("Which database engine")
    assert "Postgres 16, with logical replication to the warehouse." in contents[:2]


def test_fts_syntax_in_queries_is_plain_text(memory: Memory) -> None:
    _store(memory, _turn(ALICE, ("user", 'error: unexpected "NEAR" AND token in col:umn')))
    for query in ['"NEAR" AND', "col:umn", "a*b OR (", '"', "NOT", "   ", "the of and"]:
        result = memory.search_sync(query, identity=ALICE)  # must not raise
        assert isinstance(result.hits, list)
    assert memory.search_sync('unexpected "NEAR"', identity=ALICE).hits


def test_deleted_session_disappears_from_search(memory: Memory) -> None:
    _store(memory, _turn(ALICE, ("user", "kubernetes ingress annotations")))
    assert memory.search_sync("kubernetes ingress", identity=ALICE).hits
    memory.delete(ALICE.tenant, session=ALICE.session)
    assert memory.search_sync("kubernetes ingress", identity=ALICE).hits == []


def test_parse_query_drops_stop_words_and_quotes_terms() -> None:
    parsed = parse_query("What did Caroline's team decide about the \"retry\" policy?")
    assert parsed.terms == ("caroline", "team", "decide", "retry", "policy")
    assert parsed.match_any == '"caroline"* OR "team"* OR "decide"* OR "retry"* OR "policy"*'
    assert parse_query("what is it").empty


@pytest.mark.skipif(load_embedder() is None, reason="embedding model not installed")
async def test_hybrid_finds_paraphrase_without_shared_words(tmp_path: Path) -> None:
    mem = Memory.open(Settings(data_dir=tmp_path), embedder="auto")
    try:
        assert mem.embedder is not None
        _store(mem,
               _turn(ALICE, ("user", "My puppy chewed through the sofa cushions again.")),
               _turn(ALICE, ("user", "The quarterly tax filing is due next Tuesday.")),
               _turn(ALICE, ("user", "Lunch was a sandwich with extra pickles.")))
        result = await mem.search("dog destroyed furniture", identity=ALICE, limit=3)
        assert result.hits[0].content.startswith("My puppy chewed")
    finally:
        mem.close()
