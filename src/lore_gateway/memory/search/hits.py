"""What a search returns: ranked hits. A module of its own, free of numpy and the
model, because the gateway unpickles these from its search process (the
embedding process) and must not import the search stack (~15 MiB) to do so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SHOWN_SIDE_CHANNELS", "Hit", "Previous", "SearchResult", "hidden_side_channel",
           "text_key"]

# The side channels a search still shows. ``meta.side_channel`` holds why a call
# is one (``knowledge.sidechannel.SideChannel``). A tool-less chat app's first
# request is a one-shot, the shape of a helper's call, so it gets no knowledge
# (nothing says yet that a conversation starts there); but it is that
# conversation's own first question and answer, and the recall that cannot find
# it loses the app's opening. A title, classifier, worker or short-answer call
# quotes the conversation instead (OpenCode's titles all land in one session),
# and so does a row stored before the reason was (``true``): never a hit.
SHOWN_SIDE_CHANNELS = frozenset({"one_shot"})


@dataclass(frozen=True, slots=True)
class Previous:
    """The message before a hit in its session, which the hit carries
    (``search.with_previous``): the context index ranked the two together."""

    ref: str
    role: str
    content: str


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
    # (``memory/search/dedupe.py``), and whether every one is identical to it (else some
    # differ in a time, a duration or an address).
    folded: tuple[str, ...] = ()
    folded_identical: bool = True
    # The newer hit of the same search that states another value for a subject
    # this one states (``memory/search/supersede.py``): this one is stale, ranked just
    # below it. Empty when nothing supersedes it.
    superseded_by: str = ""
    # The message before this one in its session, when the result does not show
    # it as a hit of its own: an output's command, or the output a turn reads.
    previous: Previous | None = None


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


def hidden_side_channel(meta: object) -> bool:
    """Whether a stored row's ``meta`` marks a side channel no result shows."""
    if not isinstance(meta, dict):
        return False
    reason = meta.get("side_channel")
    return bool(reason) and reason not in SHOWN_SIDE_CHANNELS


def text_key(content: str) -> str:
    """What makes two stored messages the same message to a reader: their text,
    whitespace aside (a history stored twice, a prompt quoted by a side call)."""
    return " ".join(content.split())

