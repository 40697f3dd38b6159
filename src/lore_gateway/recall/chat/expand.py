"""Expanding recall markers in a Chat Completions request back into the exact
assistant ``tool_calls`` message + ``tool`` message (lore-spec B.6), sans-IO.

A Chat client gets a hidden recall's marker as ordinary content inside the one
assistant message of the answer (``recall/chat.py`` ``marker_content``): the
preamble, a blank line, the marker (status line, newline, anchor), a blank line,
the continuation. With chained recalls the pattern repeats. Upstream must see
what the model saw instead: for each recall the assistant message the follow-up
sent (the round's text plus the recall call) and the ``tool`` result, then the
rest of the answer as a final assistant message. When the client's text before
a marker is the stored round's text, the stored message is used verbatim, so
the upstream history is byte-identical to the follow-up's.

An anchor that is unknown, or whose conversation fingerprint does not match,
is left alone: its text goes upstream as it came.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lore_gateway.memory.store.sanitize import ANCHOR_RE
from lore_gateway.recall.anthropic.expand import StoredPair
from lore_gateway.recall.chat.live import MARKER_SEPARATOR
from lore_gateway.recall.core.anchor_context import expand_turns, prefix_context_id
from lore_gateway.recall.core.markers import parse_marker

Lookup = Callable[[str], StoredPair | None]


def expand_messages(messages: list[Any], lookup: Lookup) -> list[Any] | None:
    """The messages with every known marker expanded, or None if none was."""
    def expand(message: Any, before: list[Any]) -> list[Any] | None:
        if isinstance(message, dict) and message.get("role") == "assistant":
            return _expand_message(message, prefix_context_id(before), lookup)
        return None

    return expand_turns(messages, expand)


def _text(message: dict[str, Any]) -> str | None:
    """The message's text when it is a string or text parts only."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    return None


def _expand_message(message: dict[str, Any], context: str,
                    lookup: Lookup) -> list[Any] | None:
    text = _text(message)
    if text is None or "lore-recall:" not in text:
        return None
    pieces: list[Any] = []
    cursor = 0
    for match in ANCHOR_RE.finditer(text):
        stored = lookup(match.group("uuid"))
        if stored is None or stored.context_id != context:
            continue
        start = _marker_start(text, match)
        if start < cursor:
            continue
        before = _trim_separator(text[cursor:start], leading=cursor > 0)
        assistant = stored.assistant
        if (assistant.get("content") or "") != before:
            assistant = {**assistant, "content": before or None}
        pieces.extend([assistant, stored.tool_result])
        cursor = match.end()
    if not pieces:
        return None
    tail = _trim_separator(text[cursor:], leading=True, trailing=False)
    rest = {k: v for k, v in message.items() if k != "content"}
    if tail or rest.get("tool_calls"):
        pieces.append({**rest, "content": tail or None})
    return pieces


def _marker_start(text: str, match: re.Match[str]) -> int:
    """Where the marker of this anchor begins: at its status line when one
    precedes the anchor on the line before, else at the anchor itself."""
    start = match.start()
    if start > 0 and text[start - 1] == "\n":
        line_start = text.rfind("\n", 0, start - 1) + 1
        if parse_marker(text[line_start:match.end()]) is not None:
            return line_start
    return start


def _trim_separator(segment: str, *, leading: bool, trailing: bool = True) -> str:
    """A segment without the blank lines ``marker_content`` set around markers."""
    if leading and segment.startswith(MARKER_SEPARATOR):
        segment = segment[len(MARKER_SEPARATOR):]
    if trailing and segment.endswith(MARKER_SEPARATOR):
        segment = segment[:-len(MARKER_SEPARATOR)]
    return segment
