"""Hybrid search over stored messages: BM25 on the turn and on its context, plus vectors.

The ranking (measured on LoCoMo, see docs/search.md) scores each candidate message
``m`` as a weighted sum of normalised signals::

    score(m) = lexical · (bm25(m) + CONTEXT_WEIGHT · bm25_ctx(m)
                         + PREV_WEIGHT · bm25(prev(m)) + NEXT_WEIGHT · bm25(next(m)))
             + VECTOR_WEIGHT · vec(m)

- ``bm25(m)``: FTS5 BM25 of the message text, divided by the best in the scope;
- ``bm25_ctx(m)``: BM25 over ``context_fts``, which indexes each message together
  with the message before it in its session (an answer rarely repeats the
  question's words; the question it answers does);
- ``vec(m)``: cosine to the query above the cosine of the ``VECTOR_FLOOR_RANK``-th
  best message, divided by the best margin (the floor is the last of the
  ``VECTOR_CANDIDATES``: every vector candidate counts by how far it stands above
  the least similar of them);
- the neighbour terms let a strong match lift the adjacent messages of the same
  session, which is where its answer or its question usually is;
- ``lexical``: how much of the query its words can find at all, the best share
  of the query's information held by one of the ``LEXICAL_SHARE_HITS`` best
  word matches (``_Match.coverage``). A question asked in other words than the
  transcript's ("the little helper I wrote blew up") matches many messages by a
  few common words; the words then count by what they found and the vectors
  decide more (a question whose words are all found is ranked as before);
- a message that asks a question (ends with ``?``) shares the query's words but
  rarely holds the answer, the message after it does: a question counts
  ``QUESTION_FACTOR`` of its score and lifts the next message by
  ``QUESTION_NEXT_WEIGHT`` × its BM25 (instead of ``PREV_WEIGHT``);
- a user or assistant turn shorter than ``SHORT_CHARS`` keeps
  ``(length / SHORT_CHARS) ** SHORT_POWER`` of its score: small talk that echoes
  the query's words rarely answers it (a turn that runs a command is no small talk);
- in scope ``all`` asked from a session, that session's nearest messages and its
  best word matches are candidates too, as in scope ``session`` (each counted by
  the larger of its two scores, its best word matches lifting their neighbours):
  the best overall, of thirty sessions on a few repositories, may hold none;
- over several sessions, each of the best candidates keeps its session's best
  score over the best score (``sessions.by_session``: one session holds the work);
- a query that names a time ("on 3 June, 2023", "yesterday": ``when.find_dates``)
  is searched without the date's words, and the candidates stored at that time
  count ``1 + DATE_BOOST`` times (a lift, never a filter).

Weighted sums of normalised scores beat reciprocal rank fusion here: RRF throws
away how much better the first BM25 hit is than the tenth, and on LoCoMo it lost
to BM25 alone (docs/search.md has the figures).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lore_gateway.memory.embed.embedder import FloatArray
from lore_gateway.memory.embed.vectors import TextEmbedder, VectorSearch, vector_search
from lore_gateway.memory.search.hit_load import load_hits
from lore_gateway.memory.search.hits import Hit as Hit
from lore_gateway.memory.search.hits import SearchResult as SearchResult
from lore_gateway.memory.search.previous import with_previous
from lore_gateway.memory.search.projects import favour
from lore_gateway.memory.search.query import (
    MatchPlan,
    ParsedQuery,
    TermCost,
    identifiers,
    intent_phrases,
    parse_query,
    phrase,
    plan_match,
    prefix_eligible,
)
from lore_gateway.memory.search.rerank import RERANK_CANDIDATES, Reranker, rerank_hits
from lore_gateway.memory.search.sessions import by_session
from lore_gateway.memory.search.supersede import supersede
from lore_gateway.memory.search.termstats import TermStats
from lore_gateway.memory.search.textindex import Table, TextIndex, text_index
from lore_gateway.memory.search.when import DateCue, find_dates
from lore_gateway.storage.base import Connection

log = logging.getLogger(__name__)

# Signal weights (docs/search.md: a plateau of nearby values scores within ±0.005).
CONTEXT_WEIGHT = 1.0
# 0.85 with the floor below at the 100th cosine (sixth pass: LoCoMo tuning 0.757 ->
# 0.765 recall@10, coding +0.012 ±2 hit@10); 0.7-1.2 sit on one plateau.
VECTOR_WEIGHT = 0.85
PREV_WEIGHT = 0.3
NEXT_WEIGHT = 0.3
# BM25 candidates read per list. Fewer starve the neighbour and vector terms (200
# scored 0.003 lower recall@10 on LoCoMo than 400); the cost is in matching, not
# in this limit, so a larger value is cheap.
BM25_CANDIDATES = 400
# Vector candidates, and the rank whose cosine is the "not similar" floor. The floor
# was the 50th cosine, so candidates 50-100 added nothing; at the 100th (the last
# candidate) a moderately similar message still breaks a lexical tie or lifts an
# answer worded apart from the question. Measured in docs/search.md ("sixth pass"):
# floors 75-150 and weights 0.7-1.2 all gained on LoCoMo and on the coding set.
VECTOR_CANDIDATES = 100
VECTOR_FLOOR_RANK = 100
# Neighbours are looked up for this many of the best BM25 hits only: further down,
# PREV/NEXT_WEIGHT × a small score cannot move anything into the top results.
NEIGHBOUR_SOURCES = 40
# Questions among the candidates (see the module docstring): the share of its own
# score a question keeps, the weight of its BM25 in the next message's score, and
# how many of the best candidates are checked. On LoCoMo's tuning part a factor of
# 0.7-0.9 and a weight of 0.7-1.5 all gained (docs/search.md).
QUESTION_FACTOR = 0.8
QUESTION_NEXT_WEIGHT = 1.0
QUESTION_CANDIDATES = 100
# Characters read from a message's end to see whether it asks a question.
QUESTION_TAIL = 32
# Short turns of a person or a model ("Wow, Melanie, what a moment!", "Thanks, on
# it.") share a query's words with little text around them, so BM25 ranks them
# high, yet they rarely hold what was asked. Of the QUESTION_CANDIDATES best, a
# user or assistant message shorter than SHORT_CHARS counts
# (length / SHORT_CHARS) ** SHORT_POWER of its score; from SHORT_CHARS on (a
# paragraph) length changes nothing, so nothing is favoured for being long. Exempt:
# a tool's output, which is as long as its answer (a grep hit is one line), and a
# turn holding an identifier the query names (the command `python3 repro.py`) or
# showing the edit it asks about (``query.intent_phrases``). On
# LoCoMo's tuning part 300-2,000 characters and a power of 0.2-0.3 all gained about
# the same (docs/search.md, "Short turns").
SHORT_CHARS = 500
SHORT_POWER = 0.25
# A short turn that runs something is an action, not small talk, and the output
# after it is its answer: an agent's "THOUGHT: Run the tests.\n```bash\npytest```"
# or a stored tool call (``[tool_call:bash] {...}``). Exempt from the short-turn
# rule. The coding set, tuning part: natural questions 0.886 -> 0.909 hit@10 in
# session scope, rule-made unchanged; LoCoMo has no such turn (docs/search.md).
ACTION_MARKERS = ("```", "[tool_call:")
MAX_LIMIT = 100
# How much of the query its words can find (``lexical`` in the module docstring):
# the best coverage among this many of the best word matches (BM25 on the message
# plus its context). 5, 10 and 20 gave the same figures on the coding set and on
# LoCoMo; 5 reads least. The share never falls below MIN_LEXICAL_SHARE, so a few
# found words still order the messages the vectors leave tied.
LEXICAL_SHARE_HITS = 5
MIN_LEXICAL_SHARE = 0.05
# Candidates checked for the question's intent (``query.intent_phrases``) and the
# factor a match gets: enough to lift the message that made an edit above the ones
# that merely discuss the same code, not enough to lift an unrelated edit.
INTENT_CANDIDATES = 100
INTENT_BOOST = 1.0
# A candidate stored at a time the query names ("on 3 June, 2023", "yesterday":
# ``when.find_dates``) is multiplied by 1 + DATE_BOOST. On LoCoMo's tuning part
# 1.0-5.0 all gained about the same (docs/search.md); 20 (nearly a filter) lost.
DATE_BOOST = 2.0
# Honest scores (docs/search.md, "Scores"): a hit's score is its rank score relative
# to the best, times the query's confidence, the best of its top CONFIDENCE_HITS
# hits' own confidence: the share of the query's information (IDF-weighted terms)
# the message or its context holds, or how clearly its vector is similar. Below
# NOTHING_FOUND the query matched nothing in particular and no hit is returned;
# hits under MIN_SCORE are dropped.
CONFIDENCE_HITS = 5
NOTHING_FOUND = 0.15
MIN_SCORE = 0.02
# MiniLM cosine that counts as "not similar at all" and as "clearly the same topic".
COSINE_UNRELATED = 0.25
COSINE_SAME = 0.70
# Cost bounds of one BM25 query (docs/search.md, "Latency"): rows whose IDF walk a
# search may pay for, estimated in-scope matches FTS5 may score, and the count
# above which a term is a stop word for this store. FTS5 counts a row in ~30 ns
# and scores a match in ~1 µs; these keep both indexes within a few milliseconds.
MAX_COUNTED_ROWS = 60_000
MAX_SCORED_ROWS = 5_000
MAX_TERM_ROWS = 60_000

# The scope-token kind of each scope (schema v4: ``search_scopes``).
SCOPE_KINDS = {"all": "t", "project": "p", "session": "s"}

Scope = str


ConnFactory = Callable[[], Connection]


class Searcher:
    """Runs searches on a per-thread read connection."""

    def __init__(self, conn_factory: ConnFactory, embedder: TextEmbedder | None,
                 reranker: Reranker | None = None) -> None:
        self._conn_factory = conn_factory
        self._embedder = embedder
        self._reranker = reranker
        self._local = threading.local()
        self._vectors: VectorSearch | None = None
        # The vector index is per process; one lock keeps concurrent searches from
        # refreshing it twice (the Memory facade runs one search thread anyway).
        self._vector_lock = threading.Lock()
        self._stats = TermStats()

    def _conn(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._conn_factory()
            self._local.conn = conn
        if self._vectors is None and self._embedder is not None:
            with self._vector_lock:
                if self._vectors is None:
                    self._vectors = vector_search(conn, self._embedder.model_name,
                                                  self._embedder.dim)
        return conn

    def search(self, query: str, *, tenant: str, project: str, session: str,
               scope: Scope = "all", limit: int = 10) -> SearchResult:
        """The best ``limit`` messages of the scope for ``query``; on Postgres no
        other tenant's row is visible meanwhile (``Connection.tenant_scope``)."""
        with self._conn().tenant_scope(tenant):
            return self._search(query, tenant=tenant, project=project, session=session,
                                scope=scope, limit=limit)

    def _search(self, query: str, *, tenant: str, project: str, session: str,
                scope: Scope, limit: int) -> SearchResult:
        limit = max(1, min(limit, MAX_LIMIT))
        if scope not in SCOPE_KINDS:
            raise ValueError(f"unknown scope {scope!r}; use session, project or all")
        conn = self._conn()
        index = text_index(conn)
        own: dict[int, float] = {}
        ctx: dict[int, float] = {}
        # A date's words ("2023", "3", "june") match unrelated numbers and months in
        # the text; its meaning is matched against when messages were stored. A query
        # that is nothing but a date keeps its words.
        dates = find_dates(query, time.time())
        parsed = parse_query(dates.text)
        text = dates.text
        if parsed.empty:
            parsed, text = parse_query(query), query
        match = self._match(conn, index, parsed, scope, tenant, project, session)
        if match is not None:
            own = match.rank(conn, "messages")
            ctx = match.rank(conn, "context")
        sources = _best(own, NEIGHBOUR_SOURCES)  # the messages whose neighbours are lifted
        if scope == "all" and session and match is not None:
            # The asking session's word matches, as within it: the best 400 overall
            # may hold none of them, or too few to lift their neighbours. The words
            # are the ones the search over all sessions affords: a session's own
            # plan would afford common words too, whose every row FTS5's bm25()
            # walks for their IDF (docs/search.md, "Latency").
            mine = match.within(index.scope_token(conn, SCOPE_KINDS["session"], tenant, session))
            if mine is not None:
                sources |= _best(_merge(own, mine.rank(conn, "messages")), NEIGHBOUR_SOURCES)
                _merge(ctx, mine.rank(conn, "context"))
        qvec = self._query_vector(text)
        vec, cosines = self._vector_scores(conn, qvec, tenant, project, session, scope)
        if scope == "all" and session:
            # The asking session's nearest messages: in a store of many sessions on
            # one topic the hundred nearest overall may hold none of them.
            near, near_cosines = self._vector_scores(conn, qvec, tenant, project, session,
                                                     "session")
            _merge(vec, near)
            cosines = {**near_cosines, **cosines}
        prev_next = _neighbours(conn, sources)
        lexical = _lexical_share(conn, match, own, ctx)

        scores: dict[int, float] = {}
        for mid, s in own.items():
            scores[mid] = scores.get(mid, 0.0) + lexical * s
        for mid, s in ctx.items():
            scores[mid] = scores.get(mid, 0.0) + lexical * CONTEXT_WEIGHT * s
        for mid, s in vec.items():
            scores[mid] = scores.get(mid, 0.0) + VECTOR_WEIGHT * s
        best = sorted(scores, key=lambda mid: -scores[mid])[:QUESTION_CANDIDATES]
        questions, short = _shapes(conn, {*best, *prev_next})
        for mid in questions:
            if mid in scores:
                scores[mid] *= QUESTION_FACTOR
        for mid, (prev_id, next_id) in prev_next.items():
            s = lexical * own[mid]
            if next_id is not None:  # mid is the previous message of next_id
                lift = QUESTION_NEXT_WEIGHT if mid in questions else PREV_WEIGHT
                scores[next_id] = scores.get(next_id, 0.0) + lift * s
            if prev_id is not None:
                scores[prev_id] = scores.get(prev_id, 0.0) + NEXT_WEIGHT * s
        # A short turn keeps a share of its whole score, lifts included, unless it
        # holds an identifier the query names or shows the action it asks about.
        intent = intent_phrases(query)
        names = (*identifiers(text), *(p.strip('"') for p in intent))
        for mid in best:
            turn = short.get(mid)
            if turn is not None and not _names_any(turn, names) and not _acts(turn):
                scores[mid] *= _brevity(len(turn))
        _boost_intent(conn, index, scores, intent)
        _boost_dates(conn, scores, dates.cues)
        if scope == "all":  # the asking project first (``projects``)
            favour(conn, scores, query, project)
        if scope != "session":  # the session of the best match first (``sessions``)
            by_session(conn, scores)
        ranked = sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))
        # Duplicates, side channels and recall traffic are skipped (``hit_load``).
        wanted = max(limit, RERANK_CANDIDATES) if self._reranker is not None else limit
        hits = load_hits(conn, index, ranked, tenant, wanted)
        if self._reranker is not None:
            hits = rerank_hits(self._reranker, query, hits)
        hits = hits[:limit]
        confidence = _confidence(conn, match, cosines,
                                 [int(h.ref[2:]) for h in hits[:CONFIDENCE_HITS]])
        if confidence < NOTHING_FOUND:
            hits = []
        top = max(hits[0].score, 1e-9) if hits else 1.0
        hits = [replace(h, score=round(confidence * h.score / top, 4)) for h in hits]
        hits = [h for h in hits if h.score >= MIN_SCORE]
        hits = supersede(hits, query)  # a stale value labelled (``supersede``)
        hits = with_previous(conn, hits)  # what the context index ranked with it
        return SearchResult(query=query, scope=scope, hits=hits,
                            total=len(ranked) if hits else 0, project=project,
                            _candidates=tuple(int(h.ref[2:]) for h in hits))

    def _match(self, conn: Connection, index: TextIndex, parsed: ParsedQuery, scope: Scope,
               tenant: str, project: str, session: str) -> _Match | None:
        """The full-text query this search can afford (see ``query.plan_match``)."""
        if parsed.empty:
            return None
        kind, name = SCOPE_KINDS[scope], {"all": "", "project": project, "session": session}[scope]
        token = index.scope_token(conn, kind, tenant, name)
        if token is None:  # nothing stored in this scope
            return None
        store_rows = self._stats.store_rows(conn)
        if scope == "all":
            # No scope token: the tenant's token would make BM25 walk every row of
            # the tenant for its IDF. Other tenants' rows are filtered afterwards.
            fraction = 1.0
        else:
            in_scope = self._stats.rows(
                ("scope", token), lambda cap: index.count_scope(conn, token, cap),
                cap=store_rows, store_rows=store_rows)
            fraction = in_scope / max(store_rows, 1)
        costs = []
        missing = 0.0  # information of query words stored nowhere (for confidence)
        for term in parsed.terms:
            exact = phrase(term, prefix=False)
            df = self._term_rows(conn, index, exact, store_rows)
            if df <= MAX_TERM_ROWS and prefix_eligible(term):
                wide = phrase(term, prefix=True)
                wide_df = self._term_rows(conn, index, wide, store_rows)
                if wide_df <= MAX_TERM_ROWS:
                    exact, df = wide, wide_df
            costs.append(TermCost(exact, df))
            if df == 0:
                # Counted as a word seen once: that it is rare is all we know.
                missing += _information(1, store_rows)
        plan = plan_match(costs, scope_fraction=fraction, max_df=MAX_TERM_ROWS,
                          max_counted=MAX_COUNTED_ROWS, max_scored=MAX_SCORED_ROWS)
        # Every stored word counts towards confidence, by its information: the
        # store's stop words (more than MAX_TERM_ROWS rows) weigh little but still
        # let a query of common words find its newest matches.
        weights = tuple((c.phrase, _information(c.df, store_rows)) for c in costs if c.df > 0)
        if plan.empty and not weights and missing == 0.0:
            return None
        return _Match(plan, index, tenant, token, scoped=scope != "all", weights=weights,
                      missing=missing)

    def _term_rows(self, conn: Connection, index: TextIndex, phrase_: str,
                   store_rows: int) -> int:
        return self._stats.rows(("phrase", phrase_),
                                lambda cap: index.count_phrase(conn, phrase_, cap),
                                cap=MAX_TERM_ROWS, store_rows=store_rows)

    def _query_vector(self, query: str) -> FloatArray | None:
        """The query's embedding (None: no model, or nothing to embed)."""
        if self._embedder is None or self._vectors is None or not query.strip():
            return None
        vector: FloatArray = self._embedder.embed([query])[0]
        return vector

    def _vector_scores(self, conn: Connection, qvec: FloatArray | None, tenant: str,
                       project: str, session: str,
                       scope: Scope) -> tuple[dict[int, float], dict[int, float]]:
        """(normalised margin over the floor, raw cosine) of the nearest messages."""
        if qvec is None or self._vectors is None:
            return {}, {}
        with self._vector_lock:
            sims = self._vectors.search(
                conn, qvec, tenant=tenant,
                project=project if scope == "project" else None,
                session=session if scope == "session" else None,
                k=VECTOR_CANDIDATES)
        if not sims:
            return {}, {}
        ordered = sorted(sims.values(), reverse=True)
        floor = ordered[min(VECTOR_FLOOR_RANK, len(ordered)) - 1] if len(ordered) > 1 else 0.0
        margins = {mid: s - floor for mid, s in sims.items() if s > floor}
        top = max(margins.values(), default=0.0)
        if top <= 0:
            return {}, sims
        return {mid: m / top for mid, m in margins.items()}, sims


@dataclass(frozen=True, slots=True)
class _Match:
    """One planned full-text query, run against both indexes (``textindex.Table``)."""

    plan: MatchPlan
    index: TextIndex
    tenant: str
    token: object
    scoped: bool
    # (phrase, information) of every checkable query word, and the information of
    # the words stored nowhere: the denominator of a hit's lexical confidence.
    weights: tuple[tuple[str, float], ...] = ()
    missing: float = 0.0

    def coverage(self, conn: Connection, mids: list[int], *,
                 whole_words: bool = False) -> dict[int, float]:
        """Share of the query's information found in each message or its context;
        ``whole_words``: each word matched as itself (stemmed), not as a prefix."""
        total = sum(w for _, w in self.weights) + self.missing
        found = dict.fromkeys(mids, 0.0)
        if total <= 0 or not mids:
            return found
        # The context index holds the message itself and the one before it.
        phrases = [phrase_.removesuffix("*") if whole_words else phrase_
                   for phrase_, _ in self.weights]
        for (_, weight), matched in zip(self.weights, self.index.matching_each(
                conn, "context", phrases, mids), strict=True):
            for mid in matched:
                found[mid] += weight
        return {mid: f / total for mid, f in found.items()}

    def within(self, token: object | None) -> _Match | None:
        """The same words over a narrower scope (its ``token``; None: nothing stored)."""
        return None if token is None else replace(self, token=token, scoped=True)

    def rank(self, conn: Connection, table: Table) -> dict[int, float]:
        """BM25 of the best in-scope matches, each divided by the best (1.0 is the top)."""
        if self.plan.empty:
            return {}
        rows = self._ranked(conn, table, scoped=self.scoped)
        if not self.scoped and rows:
            marks = ",".join("?" * len(rows))
            mine = {int(r[0]) for r in conn.execute(
                f"SELECT id FROM messages WHERE id IN ({marks})"
                f" AND {self.index.tenant_column} = ?",
                (*(mid for mid, _ in rows), self.tenant))}
            if len(mine) < len(rows):
                # Another tenant's rows crowd this one's: rank inside the tenant instead.
                rows = self._ranked(conn, table, scoped=True)
        if not rows:
            return {}
        top = max(rows[0][1], 1e-9)
        return {mid: s / top for mid, s in rows}

    def _ranked(self, conn: Connection, table: Table, *,
                scoped: bool) -> list[tuple[int, float]]:
        token = self.token if scoped else None
        phrases, conjunction = self.plan.phrases, self.plan.conjunction
        if not self.plan.ranked:
            newest = self.index.newest(conn, table, phrases, conjunction=conjunction,
                                       token=token, limit=BM25_CANDIDATES)
            return [(mid, 1.0 - i / BM25_CANDIDATES) for i, mid in enumerate(newest)]
        floor = 0
        if self.plan.recent:
            row = self.index.newest(conn, table, phrases, conjunction=conjunction, token=token,
                                    limit=1, offset=self.plan.recent - 1)
            floor = row[0] if row else 0
        return self.index.bm25(conn, table, phrases, conjunction=conjunction, token=token,
                               floor=floor, limit=BM25_CANDIDATES)


def _information(df: int, rows: int) -> float:
    """How much a query word says: a smoothed IDF, positive even on a tiny store
    (FTS5's own IDF is zero for a word in half the rows of a two-row store)."""
    return math.log(1.0 + (rows + 1) / (df + 0.5))


def _lexical_share(conn: Connection, match: _Match | None, own: dict[int, float],
                   ctx: dict[int, float]) -> float:
    """The best coverage (``_Match.coverage``) of the LEXICAL_SHARE_HITS best word
    matches, at least MIN_LEXICAL_SHARE; 1.0 without a word match (nothing to
    scale). Each word is looked up as itself, not as the planner's prefix: a
    prefix lookup per message and word costs ten times as much (2.5 ms against
    0.24 ms for 5 messages at 100 k), for the same figures on the coding set and
    on LoCoMo (docs/notes/2026-12-05-issue-33-ranking.md)."""
    if match is None or not (own or ctx):
        return 1.0
    words = dict(own)
    for mid, s in ctx.items():
        words[mid] = words.get(mid, 0.0) + CONTEXT_WEIGHT * s
    best = sorted(words, key=lambda mid: (-words[mid], -mid))[:LEXICAL_SHARE_HITS]
    return max(max(match.coverage(conn, best, whole_words=True).values()), MIN_LEXICAL_SHARE)


def _confidence(conn: Connection, match: _Match | None, cosines: dict[int, float],
                mids: list[int]) -> float:
    """How clearly the best of ``mids`` answers the query, in [0, 1], comparable
    across queries: a message's lexical coverage or its cosine rescaled, whichever
    is higher."""
    lexical = match.coverage(conn, mids) if match is not None else {}
    best = 0.0
    for mid in mids:
        cosine = cosines.get(mid)
        semantic = 0.0 if cosine is None else min(1.0, max(0.0, (cosine - COSINE_UNRELATED)
                                                           / (COSINE_SAME - COSINE_UNRELATED)))
        best = max(best, lexical.get(mid, 0.0), semantic)
    return best


def _boost_intent(conn: Connection, index: TextIndex, scores: dict[int, float],
                  phrases: tuple[str, ...]) -> None:
    """Multiply the best candidates that show the asked-about action by 1 + INTENT_BOOST."""
    if not phrases or not scores:
        return
    best = sorted(scores, key=lambda mid: -scores[mid])[:INTENT_CANDIDATES]
    for mid in index.matching(conn, "messages", phrases, best):
        scores[mid] *= 1.0 + INTENT_BOOST


def _boost_dates(conn: Connection, scores: dict[int, float],
                 cues: tuple[DateCue, ...]) -> None:
    """Multiply the candidates written at a time the query names by 1 + DATE_BOOST."""
    if not cues or not scores:
        return
    ids = list(scores)
    marks = ",".join("?" * len(ids))
    for mid, created in conn.execute(
            f"SELECT id, created_at FROM messages WHERE id IN ({marks})", ids):
        if any(cue.covers(float(created)) for cue in cues):
            scores[int(mid)] *= 1.0 + DATE_BOOST


def _shapes(conn: Connection, mids: set[int]) -> tuple[set[int], dict[int, str]]:
    """The messages of ``mids`` that end with a question mark (trailing space aside),
    and the text of each user or assistant message among them shorter than
    SHORT_CHARS (tool outputs are left out: see SHORT_CHARS).

    Only each message's last characters, or a short message's text, are read
    (portable SQL on both backends); the checks themselves are Python's."""
    if not mids:
        return set(), {}
    marks = ",".join("?" * len(mids))
    rows = conn.execute(
        f"SELECT id, CASE WHEN length(content) > {QUESTION_TAIL}"
        f" THEN substr(content, length(content) - {QUESTION_TAIL - 1}) ELSE content END,"
        f" CASE WHEN role IN ('user', 'assistant') AND length(content) < {SHORT_CHARS}"
        f" THEN content END FROM messages WHERE id IN ({marks})", tuple(mids))
    questions: set[int] = set()
    short: dict[int, str] = {}
    for mid, tail, text in rows:
        if str(tail or "").rstrip().endswith("?"):
            questions.add(int(mid))
        if text is not None:
            short[int(mid)] = str(text)
    return questions, short


def _names_any(text: str, names: tuple[str, ...]) -> bool:
    """Whether ``text`` holds one of the query's identifiers (lower-cased)."""
    if not names:
        return False
    lowered = text.lower()
    return any(name in lowered for name in names)


def _acts(text: str) -> bool:
    """Whether a turn runs something (ACTION_MARKERS): a command or a tool call."""
    return any(marker in text for marker in ACTION_MARKERS)


def _brevity(length: int) -> float:
    """The share of its score a turn of ``length`` characters keeps (SHORT_CHARS)."""
    return float((min(max(length, 1), SHORT_CHARS) / SHORT_CHARS) ** SHORT_POWER)


def _merge(into: dict[int, float], scores: dict[int, float]) -> dict[int, float]:
    """Each of ``scores`` into ``into`` by the larger of its two; ``scores`` back."""
    for mid, s in scores.items():
        into[mid] = max(into.get(mid, 0.0), s)
    return scores


def _best(scores: dict[int, float], count: int) -> set[int]:
    """The ``count`` best of ``scores``."""
    return set(sorted(scores, key=lambda mid: -scores[mid])[:count])


def _neighbours(conn: Connection,
                best: set[int]) -> dict[int, tuple[int | None, int | None]]:
    """(previous, next) message id in the same session of each of ``best``."""
    if not best:
        return {}
    marks = ",".join("?" * len(best))
    # One statement for all of them (a round trip each is most of a search's time
    # on Postgres); each subquery is one step of the (tenant, session, id) index.
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT m.id,"
        " (SELECT p.id FROM messages p WHERE p.tenant = m.tenant AND p.session = m.session"
        " AND p.id < m.id ORDER BY p.id DESC LIMIT 1),"
        " (SELECT n.id FROM messages n WHERE n.tenant = m.tenant AND n.session = m.session"
        " AND n.id > m.id ORDER BY n.id LIMIT 1)"
        f" FROM messages m WHERE m.id IN ({marks})", tuple(best)).fetchall()
    return {int(mid): (int(prev) if prev is not None else None,
                       int(nxt) if nxt is not None else None) for mid, prev, nxt in rows}
