"""Search results as the text of a ``recall`` tool result (lore-spec B.4).

The model reads this, so it is compact and stable: tiers by score, one line per
message with its role, age (and its project, when not the asking one:
``projects.label``) and ``t:<id>`` reference, then the copies folded into it
(``(+3 identical: t:12, t:40, t:77)``: ``dedupe``) and, for a stale value, the
hit that changed it (``(superseded by t:88)``: ``supersede``), each line cut to a per-result
budget that favours strong matches, and the whole block kept within
``budget_chars``. A cut message shows whole lines around the query's words
(``passage``), so a detail deep in a long tool output is visible and its lines
are not cut in half. Truncated lines keep their id so the model can fetch the rest.

The per-result budget is lore-spec B.4's (the block's room shared out, weighted
by tier, clamped to 80-1,200 characters); what short hits leave of the room goes
to the cut ones, best first, up to ``MAX_RESULT_CHARS`` times their tier weight:
a strong match's passage may take 3,600 characters when the rest of the result is
short (few hits, short messages, copies folded away).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from lore_gateway.memory.search.passage import passage
from lore_gateway.memory.search.projects import label
from lore_gateway.memory.search.query import parse_query

if TYPE_CHECKING:
    from lore_gateway.memory.search.searcher import Hit, SearchResult

DEFAULT_BUDGET_CHARS = 12_000
# lore-spec B.4: at most 15 results; drop those under 0.15 of the best, keep ≥ 3.
MAX_RESULTS = 15
RELEVANCE_FLOOR = 0.15
MIN_RESULTS = 3
# Per-result content budget, clamped, and weighted by tier; raw messages weigh 0.8.
MIN_RESULT_CHARS = 80
MAX_RESULT_CHARS = 1200
RAW_SOURCE_WEIGHT = 0.8
TIERS = (("Strong Matches", 0.6, 3.0), ("Supporting", 0.3, 1.5), ("Peripheral", 0.0, 0.7))
NO_RESULTS = "No results found for this query."
# A cut result shows the lines holding the query's words; shorter words are too
# common to place them.
EXCERPT_MIN_TERM = 3
# Folded copies named on a hit's line: enough to fetch a few and see when they
# happened; the count says how many there are.
MAX_FOLDED_REFS = 8
# Room kept for the footer line.
FOOTER_ROOM = 160
HEADER = "## Recall Results"
RECALL_CALL_PREFIX = "[tool_call:recall] "

_TOOL_RESULT = re.compile(r"\[tool:[^\]\n]*\] ")


# What a recall tool result starts with, besides the search block (HEADER,
# NO_RESULTS): a detail or a batch of details (``catalog.detail_text``, the
# executor's "## Recall Details"), and the executor's own answers when nothing was
# found or memory could not answer (``recall/core/executor.py``).
RECALL_RESULT_PREFIXES = (HEADER, NO_RESULTS, "## Recall Detail", "[No results found.]",
                          "Recall search failed.", "Recall is unavailable right now:",
                          "Recall timed out:")


def is_recall_traffic(content: str) -> bool:
    """A stored recall call, or a recall result a client sent back as a tool result.

    Search never returns these: schema v5 indexes the call and the search block
    (HEADER, NO_RESULTS) as empty text (keep in step with
    ``schema._RECALL_TRAFFIC``), and ``hit_load`` drops any row this matches that
    a neighbour, an older vector or the index (detail blocks, the executor's
    failure texts) brings in.
    """
    if content.startswith(RECALL_CALL_PREFIX):
        return True
    match = _TOOL_RESULT.match(content)
    return match is not None and content.startswith(RECALL_RESULT_PREFIXES, match.end())


def age(created_at: float, now: float) -> str:
    seconds = max(0.0, now - created_at)
    if seconds < 3600:
        return f"{int(seconds // 60)}m ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h ago"
    return f"{int(seconds // 86400)}d ago"


def _excerpt_terms(query: str) -> list[str]:
    return [t for t in parse_query(query).terms if len(t) >= EXCERPT_MIN_TERM]


def _tier(score: float) -> tuple[str, float]:
    for name, floor, weight in TIERS:
        if score >= floor:
            return name, weight
    return TIERS[-1][0], TIERS[-1][2]


def _select(hits: list[Hit]) -> list[Hit]:
    kept = [h for i, h in enumerate(hits) if h.score >= RELEVANCE_FLOOR or i < MIN_RESULTS]
    return kept[:MAX_RESULTS]


def folded_note(hit: Hit) -> str:
    """`` (+3 identical: t:12, t:40, t:77)`` for a hit with copies folded into it."""
    if not hit.folded:
        return ""
    kind = "identical" if hit.folded_identical else "near-identical"
    refs = ", ".join(hit.folded[:MAX_FOLDED_REFS])
    more = len(hit.folded) - MAX_FOLDED_REFS
    return f" (+{len(hit.folded)} {kind}: {refs}{f' and {more} more' if more > 0 else ''})"


def superseded_note(hit: Hit) -> str:
    """`` (superseded by t:88)`` for a hit stating a value a newer hit changed
    (``supersede``): the reader keeps the history and knows which value holds."""
    return f" (superseded by {hit.superseded_by})" if hit.superseded_by else ""


def previous_head(hit: Hit) -> str:
    """The start of the line showing the message before a hit (``Hit.previous``),
    under the hit's own line; empty when it carries none."""
    if hit.previous is None:
        return ""
    return f"  (before it: {hit.previous.role}, {hit.previous.ref}) "


def _split(own: int, prior: int, cap: int) -> tuple[int, int]:
    """A hit's room shared with the message before it: half each, and what one
    leaves of its half to the other."""
    half = cap // 2
    own_cap = min(own, half) + max(0, half - prior) + cap % 2
    return own_cap, cap - own_cap


def _caps(needs: list[int], bases: list[int], ceilings: list[int], spare: int) -> list[int]:
    """Each result's content budget: its base, and what ``spare`` holds given to the
    results cut at their base, best first, up to their ceiling."""
    caps = []
    for need, base, ceiling in zip(needs, bases, ceilings, strict=True):
        extra = max(0, min(spare, min(need, ceiling) - base))
        caps.append(base + extra)
        spare -= extra
    return caps


def render(result: SearchResult, budget_chars: int = DEFAULT_BUDGET_CHARS,
           now: float | None = None) -> str:
    """The B.4 result block for ``result``, at most ``budget_chars`` characters."""
    if not result.hits:
        return NO_RESULTS
    now = time.time() if now is None else now
    shown = _select(result.hits)
    terms = _excerpt_terms(result.query)
    total = max(result.total, len(result.hits))
    scores = [h.score for h in shown]
    header = [
        HEADER,
        f"Found {total} results, showing top {len(shown)} "
        f"(score range: {min(scores):.2f}–{max(scores):.2f}).",
    ]
    room = max(0, budget_chars - sum(len(x) + 1 for x in header) - FOOTER_ROOM)
    per_result = room / max(1, len(shown))

    tiers = [_tier(hit.score) for hit in shown]
    heads, tails, befores = [], [], []
    for i, hit in enumerate(shown):
        where = label(hit.project, result.project)
        heading = ["", f"### {tiers[i][0]}", "#### Conversation"] \
            if i == 0 or tiers[i][0] != tiers[i - 1][0] else []
        heads.append([*heading, f"- ({hit.role}, {age(hit.created_at, now)}"
                                f"{f', project {where}' if where else ''}) "])
        tails.append(f" ({hit.ref}){folded_note(hit)}{superseded_note(hit)}")
        befores.append(previous_head(hit))
    owns = [len(" ".join(hit.content.split())) for hit in shown]
    priors = [len(" ".join(hit.previous.content.split())) if hit.previous else 0
              for hit in shown]
    needs = [own + prior for own, prior in zip(owns, priors, strict=True)]
    bases = [int(min(MAX_RESULT_CHARS, max(MIN_RESULT_CHARS,
                                           per_result * weight * RAW_SOURCE_WEIGHT)))
             for _, weight in tiers]
    ceilings = [int(MAX_RESULT_CHARS * max(1.0, weight)) for _, weight in tiers]
    fixed = sum(sum(len(x) + 1 for x in head) + len(tail) + (len(before) + 1 if before else 0)
                for head, tail, before in zip(heads, tails, befores, strict=True))
    spare = room - fixed - sum(min(n, b) for n, b in zip(needs, bases, strict=True))
    caps = _caps(needs, bases, ceilings, spare)

    body: list[str] = []
    used = 0
    count = 0
    truncated_any = False
    for hit, head, tail, before, need, cap, own, prior in zip(
            shown, heads, tails, befores, needs, caps, owns, priors, strict=True):
        own_cap, prior_cap = _split(own, prior, cap)
        lines = [*head[:-1], head[-1] + passage(hit.content, terms, own_cap) + tail]
        if hit.previous is not None:
            lines.append(before + passage(hit.previous.content, terms, prior_cap))
        size = sum(len(x) + 1 for x in lines)
        if used + size > room and count >= 1:
            truncated_any = True
            break
        truncated_any = truncated_any or need > cap
        body += lines
        used += size
        count += 1
    if count < len(shown):
        header[1] = (f"Found {total} results, showing top {count} "
                     f"(score range: {min(scores[:count]):.2f}–{max(scores[:count]):.2f}).")
    note = (f"*{count} of {total} results shown. Use recall with id parameter to see full "
            "content of truncated results.*" if truncated_any
            else f"*{count} of {total} results shown.*")
    text = "\n".join([*header, *body, "", "---", note])
    return text[:budget_chars]
