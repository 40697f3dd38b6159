"""What a search returns: ranked hits. A module of its own, free of numpy and the
model, because the gateway unpickles these from its search process (the
embedding process) and must not import the search stack (~15 MiB) to do so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Hit", "SearchResult", "text_key"]


@dataclass(frozen=True, slots=True)
class Hit:
    """One stored message found by a search.

    ``score`` is in (0, 1] and comparable across queries: 1.0 means every word of
    the query (weighted by rarity) is in the message or the one before it, or its
    meaning is clearly the same; the best hit of a vague match scores low.
    """

    ref: str
    score: float
    role: str
    content: str
    created_at: float
    session: str
    project: str
    meta: dict[str, Any] | None
    # The ids of the copies of this hit the search folded into it, best first
    # (``memory/dedupe.py``), and whether every one is identical to it (else some
    # differ in a time, a duration or an address).
    folded: tuple[str, ...] = ()
    folded_identical: bool = True


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Ranked hits plus how many candidates matched (for "Found N results")."""

    query: str
    scope: str
    hits: list[Hit]
    total: int
    # The asking project: hits of another project are labelled with theirs
    # (``render``); empty when the search asked from no project.
    project: str = ""
    # Private coverage info (lore-spec B.9): the message ids considered. Never rendered.
    _candidates: tuple[int, ...] = field(default=(), repr=False)


def text_key(content: str) -> str:
    """What makes two stored messages the same message to a reader: their text,
    whitespace aside (a history stored twice, a prompt quoted by a side call)."""
    return " ".join(content.split())

