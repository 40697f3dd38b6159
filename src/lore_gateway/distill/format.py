"""The observation-log format, shared by the worker and the extractive distiller.

A log is a date line, then one bullet per observation::

    Date: Dec 1, 2026
    * 🔴 (09:14) User: use tabs in src/, never spaces
    * 🟡 (09:20) Error in `pytest -q`: ImportError: cannot import name 'x'
    * 🟢 (09:21) Files: src/app.py, tests/test_app.py

The mark is the priority: 🔴 the user's own statements and decisions, 🟡
important findings (errors, fixes, results, failed tests, where a symbol is
defined), 🟢 minor context (commands run, files). Identifiers are
kept verbatim. Pure functions only.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

HIGH, MEDIUM, LOW = "🔴", "🟡", "🟢"
MARKS = (HIGH, MEDIUM, LOW)
# About three characters per token (the store's own estimate, memory/writer.py).
CHARS_PER_TOKEN = 3
# Output budget in tokens: 10·√N clamped to [256, 4096]. Sub-linear, so a long
# segment compresses harder than a short one, but never below a useful floor.
BUDGET_FACTOR = 10
BUDGET_MIN_TOKENS = 256
BUDGET_MAX_TOKENS = 4096

_BULLET_RE = re.compile(r"^\* (🔴|🟡|🟢) \((\d\d:\d\d)\) (.+)$")
_DATE_RE = re.compile(r"^Date: .+$")


@dataclass(frozen=True, slots=True)
class Observation:
    mark: str
    time: str  # "HH:MM"
    text: str

    def line(self) -> str:
        return f"* {self.mark} ({self.time}) {self.text}"


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def budget_tokens(input_tokens: int) -> int:
    """The most tokens a distillation of ``input_tokens`` may take."""
    raw = BUDGET_FACTOR * math.sqrt(max(0, input_tokens))
    return int(min(BUDGET_MAX_TOKENS, max(BUDGET_MIN_TOKENS, raw)))


def date_line(epoch: float) -> str:
    t = time.localtime(epoch)
    return f"Date: {time.strftime('%b', t)} {t.tm_mday}, {t.tm_year}"


def clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


def render(date: str, observations: list[Observation]) -> str:
    return "\n".join([date, *(o.line() for o in observations)])


def parse(text: str) -> tuple[str | None, list[Observation]]:
    """The date line and the bullets of a log (a model's ``<observations>`` block
    or the bare log). Lines in neither shape are dropped."""
    inner = text
    match = re.search(r"<observations>(.*?)(?:</observations>|$)", text, re.S)
    if match:
        inner = match.group(1)
    date: str | None = None
    found: list[Observation] = []
    for raw in inner.splitlines():
        line = raw.strip()
        if date is None and _DATE_RE.match(line):
            date = line
            continue
        bullet = _BULLET_RE.match(line)
        if bullet:
            found.append(Observation(bullet.group(1), bullet.group(2), bullet.group(3).strip()))
    return date, found


def fit(observations: list[Observation], budget_chars: int) -> list[Observation]:
    """Keep the most important observations that fit, in their original order.

    Fills by priority (🔴, then 🟡, then 🟢), each level oldest first, so an early
    user decision survives a late flood of minor detail.
    """
    chosen: set[int] = set()
    used = 0
    for mark in MARKS:
        for index, obs in enumerate(observations):
            if obs.mark != mark:
                continue
            cost = len(obs.line()) + 1
            if used + cost > budget_chars:
                continue
            chosen.add(index)
            used += cost
    return [o for i, o in enumerate(observations) if i in chosen]


def source_refs(ids: list[int]) -> str:
    """``t:12–t:15, t:19``: the raw messages a distillation came from, as recall ids."""
    parts: list[str] = []
    ordered = sorted(set(ids))
    start = prev = None
    for value in ordered:
        if start is None:
            start = prev = value
        elif prev is not None and value == prev + 1:
            prev = value
        else:
            parts.append(_span(start, prev))
            start = prev = value
    if start is not None:
        parts.append(_span(start, prev))
    return ", ".join(parts)


def _span(start: int, end: int | None) -> str:
    return f"t:{start}" if end is None or end == start else f"t:{start}–t:{end}"


def merge(logs: list[str], budget_tokens_: int | None = None) -> str:
    """Consolidate several logs into one (the extractive consolidation pass).

    Duplicate observations collapse to their first occurrence; the result is fitted
    to the budget of the combined input, keeping the earliest date line.
    """
    date: str | None = None
    seen: set[str] = set()
    merged: list[Observation] = []
    for log_text in logs:
        log_date, observations = parse(log_text)
        date = date or log_date
        for obs in observations:
            if obs.text not in seen:
                seen.add(obs.text)
                merged.append(obs)
    total = sum(estimate_tokens(text) for text in logs)
    budget = budget_tokens_ if budget_tokens_ is not None else budget_tokens(total)
    head = date or "Date: unknown"
    return render(head, fit(merged, budget * CHARS_PER_TOKEN - len(head) - 1))
