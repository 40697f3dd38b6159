"""Which user message is the request a mid-turn raw tail continues (pure).

When the raw tail starts inside a long agent turn, the prefix repeats the
user's request of that turn, so the model still knows what it is working on.
The nearest user text before the cut is not always that request: agent
harnesses answer a malformed reply with a nudge of their own ("Please always
provide EXACTLY ONE action in triple backticks", "The last command ... timed
out") or a bare reminder, and repeating that instead of the task leaves the
model with no task at all. A nudge is recognised by shape, not by one
harness's wording alone: it is a template (its first line recurs in other user
messages of the session), only system reminders, or one of the common harness
openings below.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from lore_gateway.protocols.history import HistoryAdapter

# Openings of messages that agent harnesses send on their own, not the user:
# mini-swe-agent / SWE-agent format and timeout feedback, Claude Code's
# interruption marker, empty tool turns.
HARNESS_OPENINGS = (
    "please always provide exactly one action",
    "the last command",
    "[request interrupted",
    "tool ran without output",
    "no output",
)
# Characters of a first line compared to find templates.
FIRST_LINE_CHARS = 120


def turn_request(history: HistoryAdapter, items: list[Any], lead: int, cut: int) -> str:
    """The request of the turn ``items[cut]`` continues: the nearest user text
    before the cut that is not a harness nudge (the nearest one when all are)."""
    texts = [(index, history.user_text(items[index])) for index in range(lead, cut)
             if history.is_user_text(items[index])]
    if not texts:
        return ""
    lines = Counter(_first_line(text) for _, text in texts)
    for _, text in reversed(texts):
        if not is_nudge(text, lines):
            return text
    return texts[-1][1]


def is_nudge(text: str, first_lines: Counter[str]) -> bool:
    """Whether a user message is the harness talking, not the user asking."""
    body = text.strip()
    if not body:
        return True
    if _only_reminders(body):
        return True
    line = _first_line(body)
    if first_lines[line] > 1:
        return True
    return line.lower().startswith(HARNESS_OPENINGS)


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0][:FIRST_LINE_CHARS]


def _only_reminders(text: str) -> bool:
    rest = text
    while rest.startswith("<system-reminder>"):
        end = rest.find("</system-reminder>")
        if end < 0:
            return True
        rest = rest[end + len("</system-reminder>"):].strip()
    return not rest
