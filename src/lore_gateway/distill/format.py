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

import heapq
import math
import re
import time
from dataclasses import dataclass

HIGH, MEDIUM, LOW = "🔴", "🟡", "🟢"
MARKS = (HIGH, MEDIUM, LOW)
# About three characters per token (the store's own estimate, memory/store/writer.py).
CHARS_PER_TOKEN = 3
# Output budget in tokens: 10·√N clamped to [256, 4096]. Sub-linear, so a long
# segment compresses harder than a short one, but never below a useful floor.
BUDGET_FACTOR = 10
BUDGET_MIN_TOKENS = 256
BUDGET_MAX_TOKENS = 4096
# The largest segment one log is distilled from (distill/store.py cuts at it).
SEGMENT_TOKENS = 16_384
# A consolidated log is at least this many times smaller than the raw messages it
# covers: 10× is the bar (issue 32), and token counts here are estimates. As dense
# as one full segment's log (about 1:13) it kept 0.69 of the coding sets' key
# facts, at 1:11 0.75 (docs/notes/2026-12-05-issue-32-retention.md).
CONSOLIDATED_RATIO = 11

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


# What a question about a session asks for: code spans, quoted values, paths and
# dotted names, calls, snake_case and camelCase identifiers, error names, numbers,
# and names (a capitalised word inside a sentence: a person, a place, a product).
_FACT_RE = re.compile(
    r"`[^`\n]+`|'[^'\n]{2,}'|\"[^\"\n]{2,}\"|\b\w+(?:[./:\\]\w+)+\b|\b[A-Za-z_]\w*\(|"
    r"\b\w*_\w+\b|\b[a-z]+[A-Z]\w*\b|\b[A-Z][a-z]+[A-Z]\w*\b|\b\d+(?:\.\d+)?\b|"
    r"(?<=[a-z,] )[A-Z][a-z]+(?: [A-Z][a-z]+)*")
# What an observation is worth before the facts it names, by its mark: a user's
# statement is what the agent was asked to do; a finding says what was learned.
MARK_VALUE = {HIGH: 3, MEDIUM: 1, LOW: 1}


def facts(text: str) -> int:
    """How many distinct fact-bearing tokens ``text`` carries (see ``_FACT_RE``)."""
    return len(set(_FACT_RE.findall(text)))


def fit(observations: list[Observation], budget_chars: int) -> list[Observation]:
    """Keep the observations worth most within the budget, in their original order."""
    return [observations[i] for i in fit_indices(observations, budget_chars)]


def fit_indices(observations: list[Observation], budget_chars: int, *,
                overhead: int | None = None) -> list[int]:
    """The indices (ascending) of the observations ``fit`` keeps.

    ``overhead``: the characters each observation costs besides its text, when it
    is not rendered as a full ``line`` (the compaction answer shows a time once).

    🔴 and 🟡 observations come before any 🟢 one (a command or a file list never
    takes a finding's room). Within each of the two tiers, a greedy cover by value
    per character (a knapsack's greedy order): an observation is worth its mark's
    value plus each fact it names that no kept observation names yet, so the tenth
    line naming the same test file is worth little and a line naming a new error is
    worth much. Ties go to the oldest, so an early decision is not crowded out.
    """
    names = [frozenset(_FACT_RE.findall(o.text)) for o in observations]
    costs = [(len(o.line()) if overhead is None else len(o.text) + overhead) + 1
             for o in observations]
    covered: set[str] = set()
    chosen: list[int] = []
    used = 0

    def value(index: int) -> float:
        fresh = len(names[index] - covered)
        return (MARK_VALUE[observations[index].mark] + fresh) / costs[index]

    for tier in ((HIGH, MEDIUM), (LOW,)):
        heap = [(-value(i), i) for i, o in enumerate(observations) if o.mark in tier]
        heapq.heapify(heap)
        while heap:
            _, index = heapq.heappop(heap)
            if used + costs[index] > budget_chars:
                continue
            current = -value(index)
            if heap and current > heap[0][0] + 1e-12:
                heapq.heappush(heap, (current, index))  # lazy greedy: worth less now
                continue
            chosen.append(index)
            used += costs[index]
            covered.update(names[index])
    return sorted(chosen)


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


def consolidation_budget(source_tokens: int, log_tokens: int) -> int:
    """The tokens a consolidated log may take: ``1 / CONSOLIDATED_RATIO`` of the raw
    messages it covers, never more than the logs it merges. Proportional to what it
    merges: nine small logs must not be squeezed into the square-root budget of
    their own size, and a long session's history is not capped at one log's room."""
    return max(1, min(log_tokens, math.ceil(source_tokens / CONSOLIDATED_RATIO)))


def merge(logs: list[str], source_tokens: int | None = None) -> str:
    """Consolidate several logs into one (the extractive consolidation pass).

    Duplicate observations collapse to their first occurrence; the result is fitted
    to ``consolidation_budget`` of ``source_tokens`` (the raw messages the logs came
    from; None: unknown, the square-root budget of the logs' own size), keeping the
    earliest date line.
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
    budget = (consolidation_budget(source_tokens, total) if source_tokens is not None
              else budget_tokens(total))
    head = date or "Date: unknown"
    return render(head, fit(merged, budget * CHARS_PER_TOKEN - len(head) - 1))
