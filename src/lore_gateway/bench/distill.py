"""``lore bench distill``: what distillation keeps, and what it would cost.

On the coding sessions in ``shared/data/coding-sessions`` (real agent traffic
with regex-labelled questions), every session is cut into segments as the
gateway cuts them and each segment is distilled. Reported per run:

- compression: raw tokens / distilled tokens (and R = distilled/√N per segment);
- worker tokens as a share of the session's tokens: what the worker would send
  and receive (prompt + output budget, or the real usage with ``--worker``),
  over the session's raw content and over the cumulative prompt tokens an agent
  pays when it resends the history each turn;
- gold survival: how many questions' answers appear verbatim in the session's
  distillations, beside a baseline in the same run that keeps the same number
  of characters from the head of each segment.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lore_gateway.bench.ingest import find_data
from lore_gateway.distill import extractive, prompts
from lore_gateway.distill import format as fmt
from lore_gateway.distill.extractive import SourceMessage
from lore_gateway.distill.store import MAX_SEGMENT_TOKENS

DEFAULT_DATA = Path("../shared/data/coding-sessions/coding_eval.json")
# Seconds between messages of a session (the dataset has no times).
MESSAGE_GAP_S = 30.0

Distiller = Callable[[list[SourceMessage]], tuple[str, int, int]]


def resolve_data_path(path: Path | None) -> Path:
    return find_data(path, DEFAULT_DATA, "coding sessions")


def segments(messages: list[SourceMessage], max_tokens: int = MAX_SEGMENT_TOKENS
             ) -> list[list[SourceMessage]]:
    """The gateway's cut (distill/store.next_segment), applied to a whole session."""
    out: list[list[SourceMessage]] = []
    current: list[SourceMessage] = []
    used = 0
    for message in messages:
        tokens = fmt.estimate_tokens(message.content)
        if current and used + tokens > max_tokens:
            out.append(current)
            current, used = [], 0
        current.append(message)
        used += tokens
    if current:
        out.append(current)
    return out


def extractive_distiller(segment: list[SourceMessage]) -> tuple[str, int, int]:
    return extractive.distill(segment), 0, 0


def head_baseline(segment: list[SourceMessage], chars: int) -> str:
    """The same number of characters, taken from the start of every message in turn."""
    share = max(1, chars // max(1, len(segment)))
    return "\n".join(m.content[:share] for m in segment)[:chars]


@dataclass
class Figures:
    sessions: int = 0
    segments: int = 0
    raw_tokens: int = 0
    distilled_tokens: int = 0
    cumulative_prompt_tokens: int = 0
    worker_tokens: int = 0
    questions: int = 0
    survived: int = 0
    survived_baseline: int = 0
    r_values: list[float] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    per_session: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self, method: str) -> dict[str, Any]:
        r = sorted(self.r_values)
        return {
            "method": method,
            "sessions": self.sessions,
            "segments": self.segments,
            "raw_tokens": self.raw_tokens,
            "distilled_tokens": self.distilled_tokens,
            "compression": round(self.raw_tokens / max(1, self.distilled_tokens), 2),
            "r_median": round(r[len(r) // 2], 2) if r else None,
            "r_at_least_1": round(sum(v >= 1 for v in r) / max(1, len(r)), 3),
            "worker_tokens": self.worker_tokens,
            "worker_share_of_raw": round(self.worker_tokens / max(1, self.raw_tokens), 4),
            "worker_share_of_prompts": round(
                self.worker_tokens / max(1, self.cumulative_prompt_tokens), 4),
            "questions": self.questions,
            "gold_survived": self.survived,
            "gold_survival": round(self.survived / max(1, self.questions), 3),
            "baseline_survived": self.survived_baseline,
            "baseline_survival": round(self.survived_baseline / max(1, self.questions), 3),
            "by_kind": {k: {"n": v[0], "survived": v[1], "baseline": v[2]}
                        for k, v in sorted(self.by_kind.items())},
            "per_session": {s: {"n": v[0], "survived": v[1]}
                            for s, v in self.per_session.items()},
            "sessions_all_kept": sum(v[0] == v[1] for v in self.per_session.values()),
            "seconds": round(self.seconds, 2),
        }


def _normal(text: str) -> str:
    return " ".join(text.split())


def run(path: Path, distiller: Distiller = extractive_distiller, *,
        worker_estimate: bool = True, limit: int = 0,
        progress: Callable[[int, int], None] | None = None) -> Figures:
    data = json.loads(path.read_text())
    questions: dict[str, list[dict[str, Any]]] = {}
    for q in data["questions"]:
        questions.setdefault(q["session_id"], []).append(q)
    figures = Figures()
    started = time.perf_counter()
    t0 = 1_796_000_000.0
    sessions = data["sessions"][:limit] if limit else data["sessions"]
    for done, session in enumerate(sessions, 1):
        messages = [SourceMessage(int(m["index"]), str(m["role"]), str(m["content"]),
                                  t0 + MESSAGE_GAP_S * int(m["index"]))
                    for m in session["messages"]]
        history = 0
        for message in messages:
            history += fmt.estimate_tokens(message.content)
            if message.role == "assistant":
                figures.cumulative_prompt_tokens += history
        logs: list[str] = []
        heads: list[str] = []
        for segment in segments(messages):
            n_in = sum(fmt.estimate_tokens(m.content) for m in segment)
            text, used_in, used_out = distiller(segment)
            n_out = fmt.estimate_tokens(text)
            if worker_estimate and used_in == 0:
                system, user, budget = prompts.observer_prompt(segment)
                used_in, used_out = fmt.estimate_tokens(system + user), budget
            figures.worker_tokens += used_in + used_out
            figures.segments += 1
            figures.raw_tokens += n_in
            figures.distilled_tokens += n_out
            figures.r_values.append(n_out / math.sqrt(max(1, n_in)))
            logs.append(text)
            heads.append(head_baseline(segment, len(text)))
        kept, baseline = _normal("\n".join(logs)), _normal("\n".join(heads))
        for q in questions.get(session["session_id"], []):
            answer = _normal(str(q["answer"]))
            hit, base = answer in kept, answer in baseline
            figures.questions += 1
            figures.survived += hit
            figures.survived_baseline += base
            row = figures.by_kind.setdefault(q["kind"], [0, 0, 0])
            row[0] += 1
            row[1] += hit
            row[2] += base
            mine = figures.per_session.setdefault(session["session_id"], [0, 0])
            mine[0] += 1
            mine[1] += hit
        figures.sessions += 1
        if progress is not None:
            progress(done, len(sessions))
    figures.seconds = time.perf_counter() - started
    return figures


# Default endpoints for the worker arm, per family.
WORKER_URLS = {"anthropic": "https://api.anthropic.com/v1/messages",
               "responses": "https://api.openai.com/v1/responses",
               "chat": "https://api.openai.com/v1/chat/completions"}
WORKER_TIMEOUT_S = 120.0


def worker_distiller(family: str, url: str, model: str, key: str) -> Distiller:
    """The worker arm: each segment sent to a real (or fake) provider, as the
    gateway's worker would send it; the log is parsed and fitted the same way."""
    import urllib.request

    import orjson

    from lore_gateway.worker import requests as wreq

    def distill(segment: list[SourceMessage]) -> tuple[str, int, int]:
        system, user, budget = prompts.observer_prompt(segment)
        body = wreq.build(family, model, system, user, budget)  # type: ignore[arg-type]
        headers = {"content-type": "application/json", "x-lore-worker": "distill"}
        if family == "anthropic":
            headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
        else:
            headers["authorization"] = f"Bearer {key}"
        request = urllib.request.Request(url, data=orjson.dumps(body), headers=headers,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=WORKER_TIMEOUT_S) as resp:
            answer = wreq.parse(family, resp.read())  # type: ignore[arg-type]
        _, observations = fmt.parse(answer.text)
        text = fmt.render(fmt.date_line(segment[0].created_at),
                          fmt.fit(observations, budget * fmt.CHARS_PER_TOKEN))
        n_in = answer.tokens_in or fmt.estimate_tokens(system + user)
        return text, n_in, answer.tokens_out or fmt.estimate_tokens(answer.text)

    return distill
