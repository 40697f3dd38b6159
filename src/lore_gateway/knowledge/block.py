"""The knowledge text the model sees: the session's block and later updates.

Pure rendering. The block is grouped by category, entries sorted by title,
filled greedily within a token budget, so the same entries always give the same
bytes (the prompt cache depends on it).
"""

from __future__ import annotations

from lore_gateway.distill.format import CHARS_PER_TOKEN
from lore_gateway.knowledge.store import CATEGORIES, Entry

BLOCK_HEADING = "## Long-term knowledge (lore-gateway)"
BLOCK_INTRO = ("Lasting facts about this project, kept from earlier sessions. Treat them as "
               "the team's notes: prefer them over guesses, and use `recall` for details.")
UPDATE_HEADING = "[lore-gateway] Knowledge learned in this session:"
UPDATE_ACK = "Noted."


def _line(entry: Entry) -> str:
    return f"* **{entry.title}**: {' '.join(entry.content.split())}"


def ordered(entries: list[Entry]) -> list[Entry]:
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    return sorted(entries, key=lambda e: (rank.get(e.category, 99), e.title.casefold(), e.id))


def render_block(entries: list[Entry], budget_tokens: int) -> tuple[str, list[str]]:
    """The block and the ids it holds; ``""`` when there is nothing to say."""
    if not entries:
        return "", []
    budget = budget_tokens * CHARS_PER_TOKEN
    lines = [BLOCK_HEADING, BLOCK_INTRO]
    used = sum(len(line) + 1 for line in lines)
    shown: list[str] = []
    category = None
    for entry in ordered(entries):
        line = _line(entry)
        heading = f"\n### {entry.category.capitalize()}" if entry.category != category else ""
        cost = len(line) + len(heading) + 1
        if used + cost > budget:
            continue
        if heading:
            lines.append(heading)
            category = entry.category
        lines.append(line)
        used += cost
        shown.append(entry.id)
    return ("\n".join(lines), shown) if shown else ("", [])


def render_update(entries: list[Entry], budget_tokens: int) -> tuple[str, list[str]]:
    """One mid-session update message: new or changed entries, within the budget."""
    budget = budget_tokens * CHARS_PER_TOKEN
    lines = [UPDATE_HEADING]
    used = len(UPDATE_HEADING)
    shown: list[str] = []
    for entry in ordered(entries):
        line = f"* ({entry.category}) **{entry.title}**: {' '.join(entry.content.split())}"
        if used + len(line) + 1 > budget:
            continue
        lines.append(line)
        used += len(line) + 1
        shown.append(entry.id)
    return ("\n".join(lines), shown) if shown else ("", [])
