"""Search over the real store: scopes, tenant isolation, ranking signals, hybrid vectors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.embed.embedder import load_embedder
from lore_gateway.memory.embed.vectors import embed_and_store
from lore_gateway.memory.search import searcher as search
from lore_gateway.memory.search.query import (
    MatchPlan,
    TermCost,
    parse_query,
    phrase,
    plan_match,
    prefix_eligible,
)
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.turn_rows import write_turn
from lore_gateway.protocols.common import Message, Role
from lore_gateway.storage import db, schema

ALICE = Identity("tenant-a", "proj-x", "s1")


def _turn(ident: Identity, *pairs: tuple[Role, str], at: float = 1.7e9) -> TurnRecord:
    return TurnRecord(identity=ident, protocol="responses", model="m",
                      messages=tuple(Message(r, t) for r, t in pairs), created_at=at)


def _store(memory: Memory, *turns: TurnRecord) -> None:
    for t in turns:
        assert memory.submit_turn(t)
    memory.flush(120)  # bounded, not timed: the embedding process may start slowly


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
    result = memory.search_sync("SSE parser", identity=ALICE)
    assert result.hits[0].content.startswith("The SSE parser")
    assert result.hits[0].ref.startswith("t:")
    assert result.hits[0].score == 1.0  # every word of the query is in it
    detail = memory.detail_sync(result.hits[0].ref, tenant=ALICE.tenant)
    assert "src/lore_gateway/sse.py" in detail
    # Another tenant cannot read it by id.
    assert "No entry found" in memory.detail_sync(result.hits[0].ref, tenant="tenant-b")


def test_answer_is_found_through_the_question_it_answers(memory: Memory) -> None:
    """The reply shares no words with the query, its predecessor does; the question
    itself holds no answer, so the reply ranks first (context, window, question lift)."""
    _store(memory,
           _turn(ALICE, ("user", "Which database engine did we pick for the ledger service?"),
                 ("assistant", "Postgres 16, with logical replication to the warehouse.")),
           _turn(ALICE, ("user", "unrelated: rename the CI job"), ("assistant", "Done.")))
    hits = memory.search_sync("ledger service database engine", identity=ALICE).hits
    contents = [h.content for h in hits]
    assert contents[0] == "Postgres 16, with logical replication to the warehouse."
    assert contents[1].startswith("Which database engine")


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
    assert [phrase(t, prefix=prefix_eligible(t)) for t in parsed.terms] == [
        '"caroline"*', '"team"*', '"decide"*', '"retry"*', '"policy"*']
    assert phrase('a"b', prefix=False) == '"a""b"'
    assert not prefix_eligible("go")
    assert parse_query("what is it").empty


def _plan(*dfs: int, fraction: float = 1.0) -> MatchPlan:
    return plan_match([TermCost(f"t{df}", df) for df in dfs], scope_fraction=fraction,
                      max_df=1_000, max_counted=1_500, max_scored=300)


def test_plan_keeps_every_term_of_a_small_store_and_drops_common_ones_of_a_large() -> None:
    assert _plan(5, 40, 200) == MatchPlan(("t5", "t40", "t200"))
    # Rarest first while the in-scope matches stay affordable: t200 would make 545.
    assert _plan(400, 5, 140) == MatchPlan(("t5", "t140"))
    # A small scope (1 % of the store) affords far more matching rows ...
    assert _plan(400, 5, 900, fraction=0.01) == MatchPlan(("t5", "t400", "t900"))
    # ... but never a term past max_df, nor more IDF walking than max_counted.
    assert _plan(5, 1_001, fraction=0.01) == MatchPlan(("t5",))
    assert _plan(900, 800, fraction=0.01) == MatchPlan(("t800",))


def test_plan_falls_back_to_the_newest_matches_of_the_conjunction() -> None:
    # Even the rarest term has too many in-scope matches: rank the newest 300.
    # The conjunction takes terms rarest first while their IDF walks stay affordable.
    assert _plan(600, 1_000) == MatchPlan(("t600",), conjunction=True, recent=300)
    assert _plan(700, 600, fraction=0.6) == MatchPlan(("t600", "t700"), conjunction=True,
                                                      recent=300)
    # Half the store in scope: 600 rows make 300 in-scope matches, still affordable.
    assert _plan(600, fraction=0.5) == MatchPlan(("t600",))
    # Every term is a stop word for this store: newest first, unranked.
    assert _plan(5_000, 2_000) == MatchPlan(("t5000", "t2000"), conjunction=True, ranked=False)
    assert _plan() == MatchPlan(())
    assert MatchPlan(("a", "b"), conjunction=True).expression == "a AND b"


def test_large_store_plans_rank_rare_terms_and_fall_back_to_recency(
        memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same search code at toy limits: a store where "deploy" is in every row."""
    monkeypatch.setattr(search, "MAX_TERM_ROWS", 20)
    monkeypatch.setattr(search, "MAX_COUNTED_ROWS", 20)
    _store(memory, *(_turn(ALICE, ("user", f"deploy note {i}"), at=1.7e9 + i)
                     for i in range(30)))
    _store(memory, _turn(ALICE, ("user", "deploy the zeppelin gateway")))
    # "deploy" matches 31 rows, past the limit: the rare term decides.
    hits = memory.search_sync("deploy zeppelin", identity=ALICE, scope="project").hits
    assert hits[0].content == "deploy the zeppelin gateway"
    # Only common terms: the newest rows that contain all of them (neighbour and
    # context signals reorder them a little, but nothing old comes back).
    hits = memory.search_sync("deploy note", identity=ALICE, scope="project", limit=3).hits
    assert hits and {h.content for h in hits} <= {f"deploy note {i}" for i in range(26, 30)}


def test_another_tenants_rows_do_not_crowd_out_this_tenants_in_scope_all(
        memory: Memory) -> None:
    crowd = Identity("tenant-b", "proj-b", "sb")
    _store(memory, *(_turn(crowd, ("user", "websocket websocket")) for _ in range(450)))
    _store(memory, _turn(ALICE, ("user", "the websocket reconnect flakes on slow networks")))
    hits = memory.search_sync("websocket", identity=ALICE, scope="all").hits
    assert [h.content for h in hits] == ["the websocket reconnect flakes on slow networks"]


@pytest.mark.sqlite_only  # FTS5's own ranking is the reference
def test_sqlite_bm25_lists_are_fts5s_ranking_ties_included(tmp_path: Path) -> None:
    """The BM25 list, sorted by SQLite, holds the rows, scores and order FTS5's
    ``ORDER BY rank`` gives, where the limit cuts through tied rows too."""
    from lore_gateway.memory.search.textindex import text_index

    settings = Settings(data_dir=tmp_path, embeddings=False)
    memory = Memory.open(settings, embedder=None)
    try:
        _store(memory, *(_turn(ALICE, ("user", text)) for text in
                         ["walrus", "walrus tusk", "walrus seal", "seal"] * 40))
    finally:
        memory.close()
    phrases = [phrase("walrus", prefix=True), phrase("seal", prefix=False)]
    conn = db.connect(settings.database)
    try:
        token = text_index(conn).scope_token(conn, "s", ALICE.tenant, ALICE.session)
        for table, fts in (("messages", "messages_fts"), ("context", "context_fts")):
            for scope in (None, token):
                expression = '{content}: ("walrus"* OR "seal")'
                if scope is not None:
                    expression = f"{{scope}}: {scope} AND {expression}"
                fts5 = [(int(mid), float(score)) for mid, score in conn.execute(
                    f"SELECT rowid, -rank FROM {fts} WHERE {fts} MATCH ?"
                    " AND rank MATCH 'bm25(1.0, 0.0)' ORDER BY rank LIMIT 50",
                    (expression,))]
                got = text_index(conn).bm25(conn, table, phrases, conjunction=False,
                                            token=scope, floor=0, limit=50)
                assert got == fts5
                assert len({score for _, score in got}) < len(got)  # ties were cut
    finally:
        conn.close()


@pytest.mark.sqlite_only  # upgrades an older SQLite file
def test_a_version_3_store_migrates_forward_and_stays_searchable(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, embeddings=False)
    conn = db.connect(settings.database)
    for migration in schema.MIGRATIONS[:3]:
        conn.execute(migration.sql)
    conn.execute("CREATE TABLE schema_version(version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1), (2), (3)")
    other = Identity("tenant-a", "proj-y", "s9")
    with conn:
        for record in (_turn(ALICE, ("user", "Which queue does the billing worker use?"),
                             ("assistant", "RabbitMQ, the durable one.")),
                       _turn(other, ("user", "billing worker in the other project"))):
            write_turn(conn, record, 1 << 20)
    conn.close()

    mem = Memory.open(settings, embedder=None)
    me = Identity("personal", ALICE.project, ALICE.session)  # v5 merged the tenants
    try:
        hits = mem.search_sync("billing worker queue", identity=me, scope="project").hits
        # The answer first: the question lifts it (search.QUESTION_NEXT_WEIGHT).
        assert [h.content for h in hits] == ["RabbitMQ, the durable one.",
                                             "Which queue does the billing worker use?"]
        assert {h.project for h in
                mem.search_sync("billing worker", identity=me, scope="all").hits} == {
            "proj-x", "proj-y"}
        # Rows written after the migration are indexed by the new triggers.
        _store(mem, _turn(me, ("user", "billing worker retries twice")))
        hits = mem.search_sync("billing retries", identity=me, scope="session").hits
        assert hits[0].content == "billing worker retries twice"
    finally:
        mem.close()


@pytest.mark.skipif(load_embedder() is None, reason="embedding model not installed")
@pytest.mark.usefixtures("database_url")
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


def test_a_date_in_the_query_lifts_what_was_stored_that_day(memory: Memory) -> None:
    from datetime import UTC, datetime

    def at(day: str) -> float:
        return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()

    # Tool outputs: the short-turn rule (user and assistant turns only) leaves them
    # alone, so BM25's own preference is what the date has to overturn.
    _store(memory,
           _turn(ALICE, ("tool", "we finally did the lake trip with the whole family and the dog"),
                 at=at("2023-02-01T15:00:00")),
           _turn(ALICE, ("tool", "lake trip"), at=at("2023-06-10T09:00:00")))

    def contents(query: str) -> list[str]:
        return [h.content for h in memory.search_sync(query, identity=ALICE).hits]

    # BM25 prefers the short message; the date names the day the long one was stored.
    assert contents("lake trip")[0] == "lake trip"
    assert contents("What about the lake trip on 1 February, 2023?")[0].startswith("we finally")
    assert contents("the lake trip in June 2023")[0] == "lake trip"
    # A date nothing was stored on changes nothing, and filters nothing out.
    assert contents("the lake trip on 5 March, 2021") == ["lake trip", contents("lake trip")[1]]


class _AxisEmbedder:
    """Stands in for MiniLM: each text's cosine to the query is set by the test
    (``cosines``), so which message is how similar is exact."""

    model_name = "test-axis"
    dim = 384

    def __init__(self, cosines: dict[str, float], query: str) -> None:
        self._cosines = cosines
        self._query = query

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(out, texts, strict=True):
            cosine = 1.0 if text == self._query else self._cosines[text]
            row[0], row[1] = cosine, math.sqrt(max(0.0, 1.0 - cosine * cosine))
        return out


@pytest.mark.usefixtures("database_url")
def test_a_moderately_similar_message_breaks_a_lexical_tie(tmp_path: Path) -> None:
    """Two messages match the query's word equally (same text length, each alone in
    its session); the one whose meaning is closer comes first, even when 60 other
    messages are closer still. The vector floor is the 100th cosine (sixth pass):
    at the 50th, a message ranked 70th by its vector got nothing and the tie went
    to the newer message."""
    settings = Settings(data_dir=tmp_path, embeddings=False)
    mem = Memory.open(settings, embedder=None)
    similar, unrelated = "the lighthouse photo", "the lighthouse story"
    cosines = {similar: 0.40, unrelated: -0.50}
    fillers = [f"filler note number {i:03d}" for i in range(110)]
    # 60 fillers are closer to the query than ``similar``, the rest are further.
    cosines.update({text: 0.9 - 0.005 * i if i < 60 else 0.3 - 0.002 * i
                    for i, text in enumerate(fillers)})
    try:
        _store(mem, *(_turn(Identity("tenant-a", "proj-x", "filler"), ("user", t))
                      for t in fillers))
        _store(mem, _turn(Identity("tenant-a", "proj-x", "s-similar"), ("user", similar)),
               _turn(Identity("tenant-a", "proj-x", "s-unrelated"), ("user", unrelated)))
    finally:
        mem.close()
    embedder = _AxisEmbedder(cosines, "lighthouse")
    conn = db.connect(settings.database)
    try:
        ids = [int(r[0]) for r in conn.execute("SELECT id FROM messages")]
        embed_and_store(conn, embedder, ids)  # type: ignore[arg-type]
    finally:
        conn.close()
    searcher = search.Searcher(db.conn_factory(settings.database), embedder)  # type: ignore[arg-type]
    hits = searcher.search("lighthouse", tenant="tenant-a", project="proj-x", session="",
                           scope="project", limit=2).hits
    assert [h.content for h in hits] == [similar, unrelated]
