"""Anthropic Messages history (``messages``, ``system``), for the features (pure).

Tool results are ``tool_result`` blocks inside user messages, so one user
message may be both a tool output and (with text beside it) more. There are no
leading instruction items: ``system`` is its own field, and a system message in
``messages`` is a mid-conversation one. Prompt caching is explicit:
``cache_control`` breakpoints, at most four per request, 5 minutes unless one
asks for an hour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lore_gateway.compaction.detect import Flow, is_claude_summary
from lore_gateway.protocols.history_common import (
    Item,
    message_text,
    retention_ttl,
    token_count,
)
from lore_gateway.routing import Family

# Anthropic allows 4 cache_control breakpoints per request.
MAX_BREAKPOINTS = 4
# A prefix cached with ``"ttl": "1h"`` on a system or tool marker.
LONG_TTL_S = 3_600.0
_USAGE_INPUT = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class AnthropicHistory:
    family = Family.ANTHROPIC
    items_key = "messages"
    instructions_file = "CLAUDE.md"

    def lead_count(self, items: list[Any]) -> int:
        return 0

    def is_user_text(self, item: Any) -> bool:
        if not isinstance(item, dict) or item.get("role") != "user":
            return False
        content = item.get("content")
        return not (isinstance(content, list) and _has_tool_result(content))

    def is_tool_output(self, item: Any) -> bool:
        if not isinstance(item, dict):
            return False
        content = item.get("content")
        return item.get("role") == "user" and isinstance(content, list) and _has_tool_result(
            content)

    def is_assistant_side(self, item: Item) -> bool:
        return item.get("role") == "assistant"

    def is_system(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("role") == "system"

    def user_text(self, item: Any) -> str:
        return message_text(item)

    def thinking_mode(self, payload: Mapping[str, Any]) -> str | None:
        config = payload.get("thinking")
        kind = config.get("type") if isinstance(config, dict) else None
        return kind if kind in ("enabled", "adaptive") else None

    def shrink_output(self, item: Item, shrink: Callable[[str], str | None]) -> Item:
        changed = False
        out: list[Any] = []
        for block in item["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                text = message_text(block) if isinstance(block.get("content"),
                                                         list) else block.get("content")
                if isinstance(text, str) and (new := shrink(text)) is not None:
                    block = {**block, "content": new}
                    changed = True
            out.append(block)
        return {**item, "content": out} if changed else item

    def without_tool_results(self, item: Item) -> Item | None:
        rest = [b for b in item["content"]
                if not (isinstance(b, dict) and b.get("type") == "tool_result")]
        return {**item, "content": rest} if rest else None

    def user_message(self, text: str, cache_control: Item | None = None) -> Item:
        block: Item = {"type": "text", "text": text}
        if cache_control is not None:
            block["cache_control"] = cache_control
        return {"role": "user", "content": [block]}

    def assistant_message(self, text: str) -> Item:
        return {"role": "assistant", "content": [{"type": "text", "text": text}]}

    def update_items(self, text: str, ack: str) -> list[Item]:
        # A user/assistant pair: role alternation holds on both sides, and the
        # model has nothing to answer.
        return [self.user_message(text), self.assistant_message(ack)]

    def add_system_text(self, payload: dict[str, Any], text: str) -> dict[str, Any]:
        system = payload.get("system")
        if isinstance(system, list):
            new: Any = [*system, {"type": "text", "text": text}]
        elif isinstance(system, str) and system:
            new = system + "\n\n" + text
        else:
            new = text
        return {**payload, "system": new}

    def cache_ttl(self, payload: Mapping[str, Any]) -> float:
        if '"ttl": "1h"' in _cache_controls(payload):
            return LONG_TTL_S
        return retention_ttl(payload)

    def cache_marker(self, payload: Mapping[str, Any], tail: list[Any]) -> Item | None:
        marker: Item = {"type": "ephemeral"}
        if ttl := prefix_ttl(payload, tail):
            marker["ttl"] = ttl
        return marker

    def fit_breakpoints(self, payload: Mapping[str, Any], items: list[Any],
                        start: int) -> list[Any]:
        excess = count_breakpoints(payload, items) - MAX_BREAKPOINTS
        return drop_oldest_breakpoints(items, excess, start) if excess > 0 else items

    def compaction_flow(self, payload: Mapping[str, Any],
                        headers: Mapping[str, str]) -> Flow | None:
        return Flow.CLAUDE_SUMMARY if is_claude_summary(payload) else None

    def usage_scaler(self) -> AnthropicUsageScaler:
        return AnthropicUsageScaler()


class AnthropicUsageScaler:
    """Anthropic reports input at ``message_start`` and output at
    ``message_delta``: the factor chosen at the start holds for the whole message."""

    __slots__ = ("_factor",)

    def __init__(self) -> None:
        self._factor: float | None = None

    def scale(self, usage: dict[str, Any], factor: Callable[[int], float | None],
              event: object) -> bool:
        delta = event == "message_delta"
        if not delta or any(isinstance(usage.get(k), int) and usage[k] for k in _USAGE_INPUT):
            total = sum(token_count(usage.get(k)) for k in (*_USAGE_INPUT, "output_tokens"))
            chosen = factor(total)
            if not delta or chosen is not None:
                self._factor = chosen
        held = self._factor
        if held is None:
            return False
        for key in (*_USAGE_INPUT, "output_tokens"):
            if isinstance(usage.get(key), int):
                usage[key] = int(usage[key] * held)
        return True


def _has_tool_result(content: list[Any]) -> bool:
    return any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _cache_controls(payload: Mapping[str, Any]) -> str:
    """The request's system and tool cache markers, as text (small: no history)."""
    parts: list[str] = []
    for key in ("system", "tools"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            for block in blocks:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    ttl = block["cache_control"].get("ttl")
                    parts.append(f'"ttl": "{ttl}"')
    return " ".join(parts)


def count_breakpoints(payload: Mapping[str, Any], items: list[Any]) -> int:
    """cache_control markers: tools, system blocks, message blocks."""
    count = 0
    for key in ("tools", "system"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            count += sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            count += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    if "cache_control" in payload:
        count += 1
    return count


def drop_oldest_breakpoints(items: list[Any], excess: int, start: int) -> list[Any]:
    """Remove the ``excess`` oldest message-level breakpoints from ``start`` on
    (the client's own markers in the raw tail; ours before ``start`` stay)."""
    out = list(items)
    for index in range(start, len(out)):
        if excess <= 0:
            break
        item = out[index]
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        blocks = []
        for block in content:
            if excess > 0 and isinstance(block, dict) and "cache_control" in block:
                block = {k: v for k, v in block.items() if k != "cache_control"}
                excess -= 1
            blocks.append(block)
        out[index] = {**item, "content": blocks}
    return out


def prefix_ttl(payload: Mapping[str, Any], tail: list[Any]) -> str | None:
    """The TTL our prefix breakpoint takes from the client's markers as they are
    in this request (Anthropic processes tools, system, then messages, and a
    ``1h`` marker must not come after a ``5m`` one).

    The client's first marker after ours (in the raw tail) when there is one: not
    shorter than anything after it, in the client's own valid order. Else the
    last marker before ours (tools, system), so ours is not longer than it. A
    client that switches its markers from 5m to 1h (Claude Code does, as quotas
    change) moves ours with them at the next render; ``cache_control`` is not
    part of the cached bytes, so following it costs no cache hit."""
    for item in tail:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    return _ttl(block["cache_control"])
    before: str | None = None
    for key in ("tools", "system"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            for block in blocks:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    before = _ttl(block["cache_control"])
    return before


def _ttl(marker: dict[str, Any]) -> str | None:
    ttl = marker.get("ttl")
    return str(ttl) if ttl else None


ANTHROPIC = AnthropicHistory()
