"""``lore bench retention``: what survives a compaction, in key facts.

The 30 sessions of ``shared/data/coding-sessions`` are stored through the proxy's
write path (``Memory.submit_turn``, as ``lore bench coding --no-noise`` stores
them; the same ``--store`` is reused), then, in a copy of that store:

1. **Distillation**, as the worker does it with the worker off: each session's
   undistilled messages are cut into segments of ``segment_tokens`` and
   distilled extractively, and after each log the first-level logs are merged once
   there are more than ``consolidate_after`` of them (``distill.store``). Each
   segment size is a regime: 16,384 tokens is the worker's token trigger; a small
   size stands for the idle trigger of an interactive session, many small logs, so
   consolidation runs.
2. **The compaction answer**, through ``CompactionService``: a Claude Code
   ``/compact`` request (Anthropic Messages, its real shape) and Codex's
   ``POST /responses/compact``; the text is read back out of each answer's body.
3. **After a compaction plus one recall** (the largest regime only): the answer
   plus the ``recall`` tool's text for the question asked as the query, in the
   question's session, as the executor renders it.

Each question's key facts (``retention_score``) are looked up in every text, and
each text is set against the same-size baselines of the same session. The held-out
part (``coding_data.held_out``, fixed before any tuning) is reported on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.bench import locomo
from lore_gateway.bench import retention_score as score
from lore_gateway.bench.coding import resolve_data_path, store_dir, write_mark
from lore_gateway.bench.coding_data import NATURAL_FILE, TENANT, Question, held_out, load
from lore_gateway.bench.ingest import Progress, ingest
from lore_gateway.bench.retention_data import Corpus, Session, coding, with_locomo
from lore_gateway.compaction import detect
from lore_gateway.compaction.service import CompactionService
from lore_gateway.config import Settings
from lore_gateway.distill import store as dstore
from lore_gateway.recall.core.executor import SEARCH_BUDGET_CHARS, SEARCH_LIMIT
from lore_gateway.routing import Protocol
from lore_gateway.storage.base import Connection

if TYPE_CHECKING:
    from lore_gateway.memory.service import Memory

__all__ = ["DEFAULT_SEGMENTS", "RetentionReport", "resolve_data_path", "run"]

# The worker's token trigger, and a small segment standing for idle-triggered ones.
DEFAULT_SEGMENTS = (dstore.MAX_SEGMENT_TOKENS, 2_048)
MEASURES = ("first_level", "distillations", "consolidated", "compaction_claude",
            "compaction_codex", "after_recall")
CODING_SETS = ("rule", "natural")
CLAUDE_HEADERS = {"user-agent": "claude-cli/2.0.14 (external, cli)",
                  "x-claude-code-session-id": "bench"}
# Claude Code's compaction request: the conversation, then its summary prompt.
CLAUDE_PROMPT = (f"{detect.CLAUDE_SUMMARY_PREAMBLE}\n\nYour task is to create a detailed "
                 "summary of the conversation so far. Wrap it in <summary></summary> tags.")


@dataclass
class RetentionReport:
    segments: tuple[int, ...]
    consolidate_after: int
    messages: int = 0
    sessions: int = 0
    ingest_s: float | None = None
    store_reused: bool = False
    # regime → measure → set → part → Retention (ours, then "<baseline>" keys)
    tallies: dict[str, dict[str, dict[str, dict[str, dict[str, score.Retention]]]]] = field(
        default_factory=dict)
    consolidated_sessions: dict[str, int] = field(default_factory=dict)

    def tally(self, regime: str, measure: str, system: str, q: Question
              ) -> Iterator[score.Retention]:
        sets = self.tallies.setdefault(regime, {}).setdefault(measure, {})
        parts = ["all", "held_out" if held_out(q.session_id) else "tuning"]
        if q.position:
            parts.append(f"position:{q.position}")
        for name in (q.set, "coding") if q.set in CODING_SETS else (q.set,):
            for part in parts:
                yield sets.setdefault(name, {}).setdefault(part, {}).setdefault(
                    system, score.Retention())

    def as_dict(self) -> dict[str, Any]:
        return {
            "segments": list(self.segments), "consolidate_after": self.consolidate_after,
            "messages": self.messages, "sessions": self.sessions,
            "ingest_s": self.ingest_s,
            "store_reused": self.store_reused,
            "consolidated_sessions": self.consolidated_sessions,
            "regimes": {regime: {measure: {name: {part: {system: t.as_dict()
                                                         for system, t in systems.items()}
                                                  for part, systems in parts.items()}
                                           for name, parts in sets.items()}
                                 for measure, sets in measures.items()}
                        for regime, measures in self.tallies.items()},
        }


@dataclass(frozen=True, slots=True)
class SessionTexts:
    """One session's memory texts after a regime's distillation."""

    first_level: str
    distillations: str
    merged: str  # the consolidated (generation ≥ 1) logs alone
    merged_indices: frozenset[int]  # the messages they cover
    merged_chars: int  # and those messages' characters
    last_index: int  # the newest message a distillation covers (-1: none)
    distilled_chars: int  # the characters of the messages up to it

    @property
    def consolidated(self) -> bool:
        return bool(self.merged)
    compaction_claude: str
    compaction_codex: str


def run(data: Path | None = None, *, natural: Path | None = None,
        locomo_data: Path | None = None, store: Path | None = None,
        segments: tuple[int, ...] = DEFAULT_SEGMENTS, consolidate_after: int | None = None,
        embeddings: bool = True, progress: Progress | None = None) -> RetentionReport:
    """Store the corpora (or reuse ``store``), then per segment size: distill in a
    copy, answer the compactions, score. ``locomo_data`` None: the default LoCoMo
    file when it is there, else the coding sessions alone."""
    from lore_gateway.memory.service import Memory

    path = resolve_data_path(data)
    corpus = coding(load(path, natural if natural is not None else path.parent / NATURAL_FILE))
    conversations = locomo_data or _default_locomo()
    if conversations is not None:
        corpus = with_locomo(corpus, conversations)
    after = consolidate_after if consolidate_after is not None else \
        Settings().distill_consolidate_after
    report = RetentionReport(tuple(sorted(segments, reverse=True)), after)
    report.messages = sum(len(s.messages) for s in corpus.sessions)
    report.sessions = len(corpus.sessions)
    mark = f"{corpus.fingerprint}:{'hybrid' if embeddings else 'bm25'}"
    with store_dir(store, mark) as (directory, fresh):
        if fresh:
            settings = Settings(data_dir=directory, embeddings=embeddings)
            memory = Memory.open(settings, embedder="auto" if embeddings else None)
            try:
                records = list(corpus.records())
                report.ingest_s = ingest(memory, settings, iter(records), len(records),
                                         progress)
                memory.write_job(lambda conn: write_mark(conn, mark))
            finally:
                memory.close()
        report.store_reused = not fresh
        with _working_copy(directory) as work:
            settings = Settings(data_dir=work, embeddings=embeddings)
            memory = Memory.open(settings, embedder="auto" if embeddings else None)
            try:
                # The largest segment last: the recall measure runs on its distillations.
                for tokens in sorted(segments):
                    _regime(report, corpus, memory, settings, tokens, after,
                            recall=tokens == max(segments), progress=progress)
            finally:
                memory.close()
    return report


def _default_locomo() -> Path | None:
    try:
        return locomo.resolve_data_path(None)
    except FileNotFoundError:
        return None


@contextmanager
def _working_copy(directory: Path) -> Iterator[Path]:
    """A copy of the ingested store: distillations are written into it and go with it."""
    with tempfile.TemporaryDirectory(prefix="lore-retention-") as tmp:
        for item in directory.iterdir():
            if item.is_file():
                shutil.copy2(item, Path(tmp) / item.name)
            elif item.is_dir():
                shutil.copytree(item, Path(tmp) / item.name)
        yield Path(tmp)


def _regime(report: RetentionReport, corpus: Corpus, memory: Memory, settings: Settings,
            tokens: int, after: int, *, recall: bool, progress: Progress | None) -> None:
    regime = f"segments_{tokens}"
    memory.write_job(_forget_distillations)
    for done, session in enumerate(corpus.sessions, 1):
        memory.write_job(partial(_distill, session=session.session_id, tokens=tokens,
                                 after=after))
        if progress is not None:
            progress(f"distilling ({tokens}-token segments)", done, len(corpus.sessions))
    memory.flush()  # the observations are searchable (and embedded) before recall runs
    compaction = CompactionService(settings, memory)
    consolidated = 0
    for done, session in enumerate(corpus.sessions, 1):
        sid = session.session_id
        texts = _session_texts(memory, compaction, session)
        consolidated += texts.consolidated
        messages = [(role, content) for _, role, content in session.messages]
        whole = sum(len(c) for _, c in messages)
        distilled = [(r, c) for i, r, c in session.messages if i <= texts.last_index]
        merged = [(r, c) for i, r, c in session.messages if i in texts.merged_indices]
        for q in (q for q in corpus.questions if q.session_id == sid):
            recall_text = _recall_text(memory, session, q) if recall else ""
            for measure in MEASURES:
                if not _applies(measure, texts, q, recall):
                    continue
                text = _measure_text(texts, measure, recall_text)
                own = len(text) - (len(recall_text) + 1 if measure == "after_recall" else 0)
                source, source_chars = _source(measure, texts, messages, whole, distilled,
                                               merged)
                for tally in report.tally(regime, measure, "lore", q):
                    tally.add(score.kept(q.facts, text))
                    tally.size(source_chars, own)
                for name in score.BASELINES:
                    base = score.baseline(name, source, own)
                    if measure == "after_recall":
                        base = f"{base}\n{recall_text}"
                    for tally in report.tally(regime, measure, name, q):
                        tally.add(score.kept(q.facts, base))
                        tally.size(source_chars, own)
        if progress is not None:
            progress(f"scoring ({tokens}-token segments)", done, len(corpus.sessions))
    report.consolidated_sessions[regime] = consolidated


def _source(measure: str, texts: SessionTexts, messages: list[tuple[str, str]], whole: int,
            distilled: list[tuple[str, str]], merged: list[tuple[str, str]]
            ) -> tuple[list[tuple[str, str]], int]:
    """What a measure's text stands for: the consolidated logs their sources, the
    other logs what is distilled, an answer the whole session."""
    if measure == "consolidated":
        return merged, texts.merged_chars
    if measure in ("first_level", "distillations"):
        return distilled, texts.distilled_chars
    return messages, whole


def _distill(conn: Connection, *, session: str, tokens: int, after: int) -> list[int]:
    return dstore.distill_extractive(conn, TENANT, session, max_tokens=tokens,
                                     consolidate_after=after, whole_segments=True)


def _applies(measure: str, texts: SessionTexts, q: Question, recall: bool) -> bool:
    """A distillation is scored on the questions whose gold message it covers."""
    if measure == "after_recall":
        return recall
    if measure in ("first_level", "distillations"):
        return q.gold <= texts.last_index
    if measure == "consolidated":
        return q.gold in texts.merged_indices
    return True


def _measure_text(texts: SessionTexts, measure: str, recall_text: str) -> str:
    if measure == "after_recall":
        return f"{texts.compaction_claude}\n{recall_text}"
    if measure == "consolidated":
        return texts.merged
    return str(getattr(texts, measure))


def _session_texts(memory: Memory, compaction: CompactionService,
                   session: Session) -> SessionTexts:
    ident, sid = session.identity, session.session_id

    def read(conn: Connection) -> SessionTexts:
        rows = conn.execute("SELECT generation, text, archived, source_ids FROM distillations"
                            " WHERE tenant = ? AND session = ? ORDER BY id",
                            (TENANT, sid)).fetchall()
        last = dstore.last_source(conn, TENANT, sid)
        stored = {int(mid): (int(orjson.loads(meta).get("index", -1)) if meta else -1,
                             int(length))
                  for mid, meta, length in conn.execute(
                      "SELECT id, meta, length(content) FROM messages WHERE tenant = ? AND"
                      " session = ? AND role != ?", (TENANT, sid, dstore.OBSERVATIONS_ROLE))}
        merged = [(str(t), orjson.loads(str(ids))) for g, t, a, ids in rows
                  if int(g) > 0 and not a]
        covered = {int(i) for _, ids in merged for i in ids if int(i) in stored}
        upto = [v for k, v in stored.items() if k <= last]
        return SessionTexts(
            first_level="\n".join(str(t) for g, t, _, _ in rows if int(g) == 0),
            distillations="\n".join(str(t) for _, t, a, _ in rows if not a),
            merged="\n".join(t for t, _ in merged),
            merged_indices=frozenset(stored[i][0] for i in covered),
            merged_chars=sum(stored[i][1] for i in covered),
            last_index=max((i for i, _ in upto), default=-1),
            distilled_chars=sum(n for _, n in upto),
            compaction_claude="", compaction_codex="")

    texts = memory.read(read)
    claude = asyncio.run(compaction.answer(Protocol.ANTHROPIC, _claude_request(),
                                           CLAUDE_HEADERS, ident))
    codex = asyncio.run(compaction.compact_endpoint(ident))
    return dataclasses.replace(
        texts, compaction_claude=_claude_summary(claude.body if claude is not None else None),
        compaction_codex=_codex_summary(codex))


def _claude_request() -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 20_000, "stream": False,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "(the conversation)",
                                              "cache_control": {"type": "ephemeral"}}]},
                {"role": "assistant", "content": [{"type": "text", "text": "…"}]},
                {"role": "user", "content": [{"type": "text", "text": CLAUDE_PROMPT}]}]}


def _claude_summary(body: bytes | None) -> str:
    if not body:
        return ""
    text = "".join(b.get("text", "") for b in orjson.loads(body).get("content", []))
    start, end = text.find("<summary>"), text.rfind("</summary>")
    return text[start + len("<summary>"):end].strip() if start >= 0 and end > start else text


def _codex_summary(body: bytes | None) -> str:
    if not body:
        return ""
    parts: list[str] = []
    for item in orjson.loads(body).get("output", []):
        for part in item.get("content", []) if isinstance(item, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    return "\n".join(parts)


def _recall_text(memory: Memory, session: Session, q: Question) -> str:
    """The recall tool's text for the question asked as its query (the executor's
    limit and budget), in the question's session."""
    result = memory.search_sync(q.question, identity=session.identity,
                                scope="session", limit=SEARCH_LIMIT)
    return memory.render(result, SEARCH_BUDGET_CHARS)


def _forget_distillations(conn: Connection) -> None:
    with conn:
        conn.execute("DELETE FROM messages WHERE role = ? AND tenant = ?",
                     (dstore.OBSERVATIONS_ROLE, TENANT))
        conn.execute("DELETE FROM turns WHERE protocol = ? AND tenant = ?",
                     (dstore.DISTILL_PROTOCOL, TENANT))
        conn.execute("DELETE FROM distillations WHERE tenant = ?", (TENANT,))
