"""``lore bench coding``: retrieval quality on real coding-agent sessions.

The set (``shared/data/coding-sessions/coding_eval.json``, see its SOURCES.md) holds
30 mini-swe-agent sessions (task, model replies with one bash command each, raw
shell output) and 173 rule-generated questions, each with the index of the gold
message. Every session is ingested through the proxy's write path
(``Memory.submit_turn``) as its own project, one turn per message, and every
question is asked through ``Memory.search_sync(scope="project", limit=10)``.

Scored as in the set's ``baseline_fts5.py``: hit@k for the exact gold message and
for any message within ±2 of it, and MRR (here over the top 10, for both
systems). The naive baseline (one SQLite FTS5 document per message, the
question's tokens OR-ed, BM25) is computed in the same run on the same data.

Held-out part: a session is held out when the first byte of
``sha1("lore-holdout:" + session_id)`` is divisible by 3 (8 of the 30 sessions,
fixed before any tuning). Figures are reported for all, tuning and held-out.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw

from lore_gateway.bench.ingest import Progress, find_data, ingest
from lore_gateway.config import Settings
from lore_gateway.memory.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role

TENANT = "bench-coding"
DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
KS = (1, 5, 10)
# Window of the lenient gold: the question's message or any within ±2 of it.
TOLERANCE = 2
ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant", "tool": "tool",
                          "system": "system"}


def held_out(key: str) -> bool:
    """The fixed held-out rule shared by both quality benches (docs/search.md)."""
    return hashlib.sha1(f"lore-holdout:{key}".encode()).digest()[0] % 3 == 0


@dataclass(frozen=True, slots=True)
class Question:
    session_id: str
    kind: str
    question: str
    gold: int


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    messages: tuple[tuple[int, str, str], ...]  # (index, role, content)


@dataclass(slots=True)
class Tally:
    """First-hit ranks (1-based, ``None`` when not in the top 10) for one subset."""

    ranks: list[int | None] = field(default_factory=list)

    def figures(self) -> dict[str, float | int]:
        n = max(len(self.ranks), 1)
        out: dict[str, float | int] = {
            f"hit@{k}": round(sum(1 for r in self.ranks if r and r <= k) / n, 4) for k in KS}
        out["mrr"] = round(sum(1.0 / r for r in self.ranks if r) / n, 4)
        out["n"] = len(self.ranks)
        return out


SUBSETS = ("all", "tuning", "held_out")


@dataclass(slots=True)
class CodingReport:
    # system ("lore" / "baseline") → subset or kind → gold definition → ranks
    tallies: dict[str, dict[str, dict[str, Tally]]] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    messages: int = 0
    ingest_s: float = 0.0
    embeddings: bool = False
    rerank: bool = False

    def add(self, system: str, q: Question, exact: int | None, tol: int | None) -> None:
        subset = "held_out" if held_out(q.session_id) else "tuning"
        for key in ("all", subset, f"kind:{q.kind}"):
            per = self.tallies.setdefault(system, {}).setdefault(key, {})
            per.setdefault("exact", Tally()).ranks.append(exact)
            per.setdefault("tol2", Tally()).ranks.append(tol)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for system, keys in self.tallies.items():
            for subset in SUBSETS:  # present even when the data has none of a subset
                golds = keys.setdefault(subset, {})
                golds.setdefault("exact", Tally())
                golds.setdefault("tol2", Tally())
            out[system] = {key: {gold: t.figures() for gold, t in golds.items()}
                           for key, golds in sorted(keys.items())}
        out["median_query_ms"] = (round(statistics.median(self.latencies_ms), 2)
                                  if self.latencies_ms else None)
        out["messages"] = self.messages
        out["ingest_s"] = round(self.ingest_s, 2)
        out["embeddings"] = self.embeddings
        out["rerank"] = self.rerank
        return out


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding set")


def load(path: Path) -> tuple[list[Session], list[Question]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    sessions = [Session(str(s["session_id"]), tuple(
        (int(m["index"]), str(m["role"]), str(m["content"])) for m in s["messages"]))
        for s in data["sessions"]]
    questions = [Question(str(q["session_id"]), str(q["kind"]), str(q["question"]),
                          int(q["message_index"])) for q in data["questions"]]
    return sessions, questions


def turn_records(session: Session) -> Iterator[TurnRecord]:
    """One TurnRecord per message; the message index travels in its metadata."""
    ident = Identity(TENANT, session.session_id, session.session_id)
    for index, role, content in session.messages:
        yield TurnRecord(identity=ident, protocol="bench:coding", model=None,
                         messages=(Message(ROLES.get(role, "user"), content),),
                         created_at=1.7e9 + index, metas=({"index": index},))


def first_ranks(ranked: list[int], gold: int) -> tuple[int | None, int | None]:
    """(rank of the exact gold, rank of the first message within ±TOLERANCE)."""
    exact = next((i + 1 for i, x in enumerate(ranked) if x == gold), None)
    tol = next((i + 1 for i, x in enumerate(ranked) if abs(x - gold) <= TOLERANCE), None)
    return exact, tol


def baseline_rankings(session: Session, questions: list[Question]) -> list[list[int]]:
    """The set's naive baseline: FTS5 ``porter unicode61``, one row per message,
    the question's alphanumeric tokens quoted and OR-ed, ``ORDER BY bm25``."""
    conn = apsw.Connection(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE m USING fts5(content, tokenize='porter unicode61')")
        with conn:
            conn.executemany("INSERT INTO m(rowid, content) VALUES (?, ?)",
                             [(i, c) for i, _, c in session.messages])
        out = []
        for q in questions:
            tokens = list(dict.fromkeys(re.findall(r"[^\W_]+", q.question.lower())))
            expr = " OR ".join(f'"{t}"' for t in tokens)
            out.append([int(r[0]) for r in conn.execute(
                "SELECT rowid FROM m WHERE m MATCH ? ORDER BY bm25(m) LIMIT 10", (expr,))])
        return out
    finally:
        conn.close()


def run(data: Path | None = None, *, embeddings: bool = True, rerank: bool = False,
        progress: Progress | None = None) -> CodingReport:
    """Ingest every session, ask every question with both systems, score."""
    from lore_gateway.memory.service import Memory

    sessions, questions = load(resolve_data_path(data))
    by_session: dict[str, list[Question]] = {}
    for q in questions:
        by_session.setdefault(q.session_id, []).append(q)
    report = CodingReport()
    for s in sessions:
        qs = by_session.get(s.session_id, [])
        for q, ranked in zip(qs, baseline_rankings(s, qs), strict=True):
            report.add("baseline", q, *first_ranks(ranked, q.gold))
    with tempfile.TemporaryDirectory(prefix="lore-coding-") as tmp:
        settings = Settings(data_dir=Path(tmp), embeddings=embeddings, rerank=rerank)
        memory = Memory.open(settings, embedder="auto" if embeddings else None)
        try:
            report.embeddings = memory.embeddings
            report.rerank = rerank
            total = sum(len(s.messages) for s in sessions)
            report.ingest_s = ingest(memory, settings,
                                     (r for s in sessions for r in turn_records(s)),
                                     total, progress)
            report.messages = total
            asked = 0
            for s in sessions:
                ident = Identity(TENANT, s.session_id, s.session_id)
                for q in by_session.get(s.session_id, []):
                    t0 = time.perf_counter()
                    result = memory.search_sync(q.question, identity=ident, scope="project",
                                                limit=10)
                    report.latencies_ms.append((time.perf_counter() - t0) * 1000)
                    ranked = [int((h.meta or {}).get("index", -99)) for h in result.hits]
                    report.add("lore", q, *first_ranks(ranked, q.gold))
                    asked += 1
                    if progress is not None:
                        progress("questions", asked, len(questions))
        finally:
            memory.close()
    return report
