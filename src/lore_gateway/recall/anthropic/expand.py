"""Expanding recall markers in an Anthropic request back into the exact
``tool_use`` / ``tool_result`` pair (lore-spec B.6), sans-IO.

The client's transcript holds, where a hidden recall happened, the preamble
message, a marker message and the continuation (three envelopes), or the
marker inline in one message. Upstream must see what the model saw in the
follow-up: the assistant message ending with the recall ``tool_use``, the user
message with its ``tool_result``, then the continuation. The stored pair is
the follow-up's two messages verbatim, so the upstream history is
byte-identical turn after turn and prompt caching keeps hitting.

The stored assistant message replaces the client's preamble only when the
client's preamble blocks are the same blocks (thinking signatures included) and
carry no ``cache_control``; otherwise the client's blocks stay and the marker
block alone becomes the ``tool_use``. Breakpoints are never added or dropped: one
on the marker block moves to the ``tool_use`` that replaces it.

An anchor is expanded only when the stored recall's conversation fingerprint
(``anchor_context.prefix_context_id``) matches the messages before it; an
unknown or foreign anchor stays text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from lore_gateway.recall.core.anchor_context import prefix_context_id
from lore_gateway.recall.core.markers import parse_marker


class StoredPair(Protocol):
    """What expansion needs from a stored recall (any protocol)."""

    @property
    def assistant(self) -> dict[str, Any]: ...

    @property
    def tool_result(self) -> dict[str, Any]: ...

    @property
    def context_id(self) -> str: ...


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def _anchor(block: Any) -> str | None:
    if not isinstance(block, dict) or block.get("type") != "text":
        return None
    text = block.get("text")
    parsed = parse_marker(text) if isinstance(text, str) else None
    return parsed.anchor_id if parsed is not None else None


def _without_cache_control(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def expand_messages(messages: list[Any],
                    lookup: Callable[[str], StoredPair | None]) -> list[Any] | None:
    """The messages with every known marker expanded, or None if none was."""
    out: list[Any] = []
    changed = False
    i = 0
    while i < len(messages):
        message = messages[i]
        if not isinstance(message, dict) or message.get("role") != "assistant":
            out.append(message)
            i += 1
            continue
        run: list[Any] = []
        while i < len(messages) and isinstance(messages[i], dict) \
                and messages[i].get("role") == "assistant":
            run.extend(_blocks(messages[i]))
            i += 1
        expanded = _expand_run(run, prefix_context_id(out), lookup)
        if expanded is None:
            out.extend(messages[i - _run_length(messages, i):i])
        else:
            out.extend(expanded)
            changed = True
    return out if changed else None


def _run_length(messages: list[Any], end: int) -> int:
    count = 0
    while end - count - 1 >= 0 and isinstance(messages[end - count - 1], dict) \
            and messages[end - count - 1].get("role") == "assistant":
        count += 1
    return count


def _expand_run(blocks: list[Any], context: str,
                lookup: Callable[[str], StoredPair | None]) -> list[dict[str, Any]] | None:
    out: list[dict[str, Any]] = []
    pending: list[Any] = []
    found = False
    for block in blocks:
        anchor = _anchor(block)
        stored = lookup(anchor) if anchor is not None else None
        if stored is None or stored.context_id != context:
            pending.append(block)
            continue
        found = True
        stored_blocks = list(stored.assistant.get("content") or [])
        tool_use = stored_blocks[-1]
        if "cache_control" in block:
            tool_use = {**tool_use, "cache_control": block["cache_control"]}
        preamble = [_without_cache_control(b) for b in pending]
        if preamble == stored_blocks[:-1] and preamble == pending and tool_use is stored_blocks[-1]:
            out.append(stored.assistant)
        else:
            out.append({"role": "assistant", "content": [*pending, tool_use]})
        out.append(stored.tool_result)
        pending = []
    if not found:
        return None
    if pending:
        out.append({"role": "assistant", "content": pending})
    return out
