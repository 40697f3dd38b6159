"""The knowledge text the model sees: the session's block and later updates.

Pure rendering. The block is grouped by category, entries sorted by title,
filled greedily within a token budget, so the same entries always give the same
bytes (the prompt cache depends on it). Only current values are shown: an entry
whose value for a subject a newer entry states otherwise is left out
(``current``), so a session is never told a superseded decision.
"""

from __future__ import annotations

from lore_gateway.distill.format import CHARS_PER_TOKEN
from lore_gateway.knowledge.store import CATEGORIES, Entry
from lore_gateway.memory.search.supersede import statements

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


def current(entries: list[Entry]) -> list[Entry]:
    """``entries`` without those a newer entry supersedes (another value for a
    subject both state: ``memory.supersede``). The store already merges such a
    create into the older entry (``store.upsert``); this covers entries written
    before that rule, or edited by id into a contradiction."""
    said = {e.id: statements(f"{e.title}\n{e.content}") for e in entries}
    newest: dict[str, tuple[Entry, str]] = {}
    for entry in sorted(entries, key=lambda e: (e.updated_at, e.id)):
        for statement in said[entry.id]:
            newest[statement.subject] = (entry, statement.value)
    return [e for e in entries
            if not any(newest[s.subject][0].id != e.id and newest[s.subject][1] != s.value
                       for s in said[e.id])]


# Characters a category heading costs in the block.
_HEADING_CHARS = 20


def render_block(entries: list[Entry], budget_tokens: int) -> tuple[str, list[str]]:
    """The block and the ids it holds; ``""`` when there is nothing to say.

    When not everything fits, the most confident and most recently confirmed
    entries are chosen; they are then shown grouped and sorted, so the same
    entries always give the same bytes.
    """
    entries = current(entries)
    if not entries:
        return "", []
    budget = budget_tokens * CHARS_PER_TOKEN - len(BLOCK_HEADING) - len(BLOCK_INTRO) - 2
    chosen: list[Entry] = []
    categories: set[str] = set()
    used = 0
    for entry in sorted(entries, key=lambda e: (-e.confidence, -e.updated_at, e.id)):
        cost = len(_line(entry)) + 1 + (_HEADING_CHARS if entry.category not in categories
                                         else 0)
        if used + cost > budget:
            continue
        chosen.append(entry)
        categories.add(entry.category)
        used += cost
    if not chosen:
        return "", []
    lines = [BLOCK_HEADING, BLOCK_INTRO]
    category = None
    for entry in ordered(chosen):
        if entry.category != category:
            lines.append(f"\n### {entry.category.capitalize()}")
            category = entry.category
        lines.append(_line(entry))
    return "\n".join(lines), [e.id for e in ordered(chosen)]


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
