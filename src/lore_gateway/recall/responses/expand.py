"""Expanding recall anchors in a Responses request back into the exact
``function_call`` + ``function_call_output`` pair (lore-spec B.6), sans-IO.

A Responses client received, where a hidden recall happened, an assistant
message item whose only text is the anchor ``<!-- lore-recall:<uuid> -->``, and
echoes it in the next request's ``input`` (the openai SDK and Codex both send
output items back as they got them). Upstream must instead see the two items the
follow-up sent, so history is what the model saw and the prompt cache holds:

* an item that is exactly the anchor is replaced by the stored pair;
* an anchor inside a longer item (a client that merged text parts, or flattened
  the output into one string) splits it: the text before, the pair, the text
  after; the pieces keep the item's fields (the second without its ``id``, which
  must stay unique).

An anchor that is unknown, or whose conversation fingerprint does not match, is
left alone: its text goes upstream as it came.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lore_gateway.memory.store.sanitize import ANCHOR_RE
from lore_gateway.recall.anthropic.expand import StoredPair
from lore_gateway.recall.core.anchor_context import expand_turns, prefix_context_id

Lookup = Callable[[str], StoredPair | None]
_TEXT_PARTS = ("output_text", "input_text", "text")


def expand_input(body: dict[str, Any], lookup: Lookup) -> dict[str, Any] | None:
    """The body with every known anchor in ``input`` expanded; None when nothing
    changed (the client's bytes are forwarded)."""
    items = body.get("input")
    if not isinstance(items, list):
        return None
    out = expand_turns(items, lambda item, before: _expand_item(item, before, lookup)
                       if _is_assistant_message(item) else None)
    return {**body, "input": out} if out is not None else None


def _is_assistant_message(item: Any) -> bool:
    return (isinstance(item, dict) and item.get("role") == "assistant"
            and item.get("type", "message") == "message")


def _expand_item(item: dict[str, Any], prefix: list[Any], lookup: Lookup) -> list[Any] | None:
    """The item's replacement, or None to keep it as is."""
    content = item.get("content")
    string_content = isinstance(content, str)
    parts: list[Any] = [{"type": "output_text", "text": content}] if string_content \
        else list(content) if isinstance(content, list) else []
    pieces: list[Any] = []
    kept: list[Any] = []
    found = False
    for part in parts:
        text = part.get("text") if isinstance(part, dict) \
            and part.get("type") in _TEXT_PARTS else None
        if not isinstance(text, str) or "lore-recall:" not in text:
            kept.append(part)
            continue
        cursor = 0
        for match in ANCHOR_RE.finditer(text):
            stored = _matching(match.group("uuid"), [*prefix, *pieces], lookup)
            if stored is None:
                continue
            found = True
            before = text[cursor:match.start()]
            if before:
                kept.append({**part, "text": before})
            if kept:
                pieces.append(_message_like(item, kept, string_content, first=not pieces))
                kept = []
            pieces.extend([stored.assistant, stored.tool_result])
            cursor = match.end()
        after = text[cursor:] if cursor else text
        if after and cursor:
            kept.append({**part, "text": after})
        elif not cursor:
            kept.append(part)
    if not found:
        return None
    if kept:
        pieces.append(_message_like(item, kept, string_content, first=False))
    return pieces


def _matching(anchor_id: str, prefix: list[Any], lookup: Lookup) -> StoredPair | None:
    stored = lookup(anchor_id)
    if stored is None or stored.context_id != prefix_context_id(prefix):
        return None
    return stored


def _message_like(item: dict[str, Any], parts: list[Any], string_content: bool,
                  *, first: bool) -> dict[str, Any]:
    """A piece of a split message item: the item's fields, these parts."""
    piece = {k: v for k, v in item.items() if first or k != "id"}
    if string_content:
        piece["content"] = "".join(str(p.get("text", "")) for p in parts)
    else:
        piece["content"] = parts
    return piece
