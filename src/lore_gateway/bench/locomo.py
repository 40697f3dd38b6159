"""``lore bench locomo``: retrieval quality of memory search on LoCoMo.

Every conversation is ingested through the proxy's own write path
(``Memory.submit_turn``: sanitiser, writer thread, FTS triggers, embedding
worker) as one project, one session per LoCoMo session, one turn per dialogue
line. Every question is then asked through ``Memory.search_sync`` with scope
``project``, the call the ``recall`` tool makes, and the ranked hits are mapped
back to LoCoMo ``dia_id``s through message metadata.

Scoring follows shared/data/SOURCES.md: evidence ids are cleaned (split on
``;``/``,``/whitespace, ``D:11:26`` → ``D11:26``, ``D30:05`` → ``D30:5``, ids that
do not exist are dropped, questions left without evidence are skipped);
recall@k is the fraction of evidence turns in the top k, MRR is 1/rank of the
first evidence turn.

Held-out part: categories 1–4 are also reported separately for the conversations
the fixed rule ``bench.coding.held_out`` sets aside (``conv-41`` of the
development half), which were not looked at while tuning the ranking.
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lore_gateway.bench.coding import held_out
from lore_gateway.bench.ingest import Progress, find_data, ingest
from lore_gateway.config import Settings
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message, Role

TENANT = "bench-locomo"
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                  5: "adversarial"}
DEFAULT_DATA = Path("../shared/data/locomo/locomo10_dev.json")
_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA = re.compile(r"D(\d+):(\d+)")



@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    session: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    speaker_a: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


@dataclass(slots=True)
class Tally:
    r5: float = 0.0
    r10: float = 0.0
    rr: float = 0.0
    n: int = 0

    def add(self, r5: float, r10: float, rr: float) -> None:
        self.r5 += r5
        self.r10 += r10
        self.rr += rr
        self.n += 1

    def figures(self) -> dict[str, float | int]:
        d = max(self.n, 1)
        return {"recall@5": round(self.r5 / d, 4), "recall@10": round(self.r10 / d, 4),
                "mrr": round(self.rr / d, 4), "n": self.n}


@dataclass(slots=True)
class LocomoReport:
    categories: dict[int, Tally] = field(default_factory=dict)
    cats_1_4: Tally = field(default_factory=Tally)
    all: Tally = field(default_factory=Tally)
    # Categories 1–4 split by the fixed held-out rule (``coding.held_out``, by sample id).
    tuning_1_4: Tally = field(default_factory=Tally)
    held_out_1_4: Tally = field(default_factory=Tally)
    latencies_ms: list[float] = field(default_factory=list)
    messages: int = 0
    ingest_s: float = 0.0
    embeddings: bool = False
    rerank: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "cats_1_4": self.cats_1_4.figures(),
            "all": self.all.figures(),
            "tuning_1_4": self.tuning_1_4.figures(),
            "held_out_1_4": self.held_out_1_4.figures(),
            "categories": {str(c): t.figures() for c, t in sorted(self.categories.items())},
            "median_query_ms": round(statistics.median(self.latencies_ms), 2)
            if self.latencies_ms else None,
            "p99_query_ms": round(_percentile(self.latencies_ms, 99), 2)
            if self.latencies_ms else None,
            "messages": self.messages,
            "ingest_s": round(self.ingest_s, 2),
            "embeddings": self.embeddings,
            "rerank": self.rerank,
        }


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "LoCoMo data")


def clean_evidence(raw: list[str], valid: set[str]) -> tuple[str, ...]:
    """Apply the SOURCES.md evidence fixes; keep only ids that exist, in order."""
    out: dict[str, None] = {}
    for item in raw:
        for part in re.split(r"[;,\s]+", str(item)):
            match = _DIA.fullmatch(part.replace("D:", "D"))
            if match is None:
                continue
            dia = f"D{int(match.group(1))}:{int(match.group(2))}"
            if dia in valid:
                out[dia] = None
    return tuple(out)


def parse_date(text: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` → unix seconds (UTC); 0.0 when unparseable."""
    try:
        parsed = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
        return parsed.replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def load(path: Path) -> list[Conversation]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [_conversation(item) for item in data]


def _conversation(item: dict[str, Any]) -> Conversation:
    conv = item["conversation"]
    numbers = sorted(int(m.group(1)) for k, v in conv.items()
                     if (m := _SESSION_KEY.fullmatch(k)) and isinstance(v, list))
    turns = []
    for n in numbers:
        start = parse_date(str(conv.get(f"session_{n}_date_time", "")))
        for i, t in enumerate(conv[f"session_{n}"]):
            text = f"{t['speaker']}: {t['text']}"
            if t.get("blip_caption"):
                text += f" [shares {t['blip_caption']}]"
            turns.append(Turn(dia_id=t["dia_id"], speaker=t["speaker"], text=text, session=n,
                              created_at=start + i))
    valid = {t.dia_id for t in turns}
    questions = []
    for qa in item["qa"]:
        evidence = clean_evidence(list(qa.get("evidence", [])), valid)
        if evidence:
            questions.append(Question(str(qa["question"]), evidence, int(qa["category"])))
    return Conversation(item["sample_id"], conv["speaker_a"], tuple(turns), tuple(questions))


def turn_records(conv: Conversation) -> Iterator[TurnRecord]:
    """One TurnRecord per dialogue line, as the proxy would store a live turn."""
    for turn in conv.turns:
        role: Role = "user" if turn.speaker == conv.speaker_a else "assistant"
        yield TurnRecord(
            identity=Identity(TENANT, conv.sample_id, f"{conv.sample_id}/session_{turn.session}"),
            protocol="bench:locomo", model=None,
            messages=(Message(role, turn.text),), created_at=turn.created_at,
            metas=({"dia_id": turn.dia_id},),
        )


def run(data: Path | None = None, *, embeddings: bool = True, rerank: bool = False,
        limit_conversations: int | None = None,
        progress: Progress | None = None) -> LocomoReport:
    """Ingest, ask every question, score. Uses a throw-away data directory."""
    from lore_gateway.memory.service import Memory

    convs = load(resolve_data_path(data))[:limit_conversations]
    report = LocomoReport()
    with tempfile.TemporaryDirectory(prefix="lore-locomo-") as tmp:
        settings = Settings(data_dir=Path(tmp), embeddings=embeddings, rerank=rerank)
        memory = Memory.open(settings, embedder="auto" if embeddings else None)
        try:
            report.embeddings = memory.embeddings
            report.rerank = rerank
            total_turns = sum(len(c.turns) for c in convs)
            report.ingest_s = ingest(memory, settings,
                                     (r for conv in convs for r in turn_records(conv)),
                                     total_turns, progress)
            report.messages = total_turns
            total_q = sum(len(c.questions) for c in convs)
            asked = 0
            for conv in convs:
                ident = Identity(TENANT, conv.sample_id, "")
                for q in conv.questions:
                    t0 = time.perf_counter()
                    result = memory.search_sync(q.question, identity=ident, scope="project",
                                                limit=10)
                    report.latencies_ms.append((time.perf_counter() - t0) * 1000)
                    ranked = [str((h.meta or {}).get("dia_id")) for h in result.hits]
                    _score(report, q, ranked, holdout=held_out(conv.sample_id))
                    asked += 1
                    if progress is not None and asked % 25 == 0:
                        progress("questions", asked, total_q)
        finally:
            memory.close()
    return report


def _score(report: LocomoReport, q: Question, ranked: list[str], *, holdout: bool) -> None:
    evidence = set(q.evidence)
    r5 = len(evidence & set(ranked[:5])) / len(evidence)
    r10 = len(evidence & set(ranked[:10])) / len(evidence)
    rr = next((1.0 / (i + 1) for i, d in enumerate(ranked[:10]) if d in evidence), 0.0)
    report.categories.setdefault(q.category, Tally()).add(r5, r10, rr)
    if 1 <= q.category <= 4:
        report.cats_1_4.add(r5, r10, rr)
        (report.held_out_1_4 if holdout else report.tuning_1_4).add(r5, r10, rr)
    report.all.add(r5, r10, rr)
