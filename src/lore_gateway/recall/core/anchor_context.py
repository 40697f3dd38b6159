"""Which conversation a recall anchor belongs to (lore-spec B.6 ``anchorContextId``).

An anchor is expanded only in the conversation it was created in: a marker a
user copies into another conversation must not pull a stored tool pair into
it. The fingerprint is taken over what the *user* said before the recall's
turn: the user-authored text of every user message, in order. That is what
every client echoes faithfully turn after turn, while the parts it is free to
re-serialise are left out: item ids, ``cache_control``, reasoning blobs,
assistant text, tool results (ours among them, which expansion itself adds),
and harness reminders that some clients re-render between turns.

Works on the four wire formats alike: Responses ``input`` items (or a bare
string), Anthropic and Chat ``messages``, Gemini ``contents`` (text ``parts``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lore_gateway.recall.core.markers import context_id

# Text parts a client writes for a user. Tool results and images are not text.
_TEXT_PARTS = ("text", "input_text")
# Reminders a harness may re-render between turns (Claude Code); never the user's words.
_VOLATILE_PREFIXES = ("<system-reminder>",)


def history_items(body: dict[str, Any], key: str) -> list[Any]:
    """The request's conversation as a list (a Responses string input is one user item)."""
    value = body.get(key)
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def prefix_context_id(items: list[Any]) -> str:
    """The fingerprint of the conversation up to (not including) a recall's turn."""
    return context_id(_user_texts(items))


def expand_turns(items: list[Any],
                 expand: Callable[[Any, list[Any]], list[Any] | None]) -> list[Any] | None:
    """``items`` with each one ``expand(item, before)`` rewrites replaced by its
    pieces (``before``: the items ahead of it, already expanded, whose context the
    marker names); None when none was."""
    out: list[Any] = []
    changed = False
    for item in items:
        pieces = expand(item, out)
        if pieces is None:
            out.append(item)
        else:
            out.extend(pieces)
            changed = True
    return out if changed else None


def _user_texts(items: list[Any]) -> Iterator[str]:
    for item in items:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content")
        parts = item.get("parts")
        if isinstance(content, str):
            texts = [content]
        elif isinstance(content, list):
            texts = [p["text"] for p in content
                     if isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                     and isinstance(p.get("text"), str)]
        elif isinstance(parts, list):  # Gemini: a text part has no type
            texts = [p["text"] for p in parts
                     if isinstance(p, dict) and isinstance(p.get("text"), str)]
        else:
            texts = []
        for text in texts:
            stripped = text.strip()
            if stripped and not stripped.startswith(_VOLATILE_PREFIXES):
                yield stripped
