"""OpenAI Responses history (``input``, ``instructions``), for the features (pure).

The history is a list of typed items: messages (``type`` defaults to
``message``), tool calls and their ``*_call_output`` items, reasoning. System
and developer messages before the first user message are the leading
instructions; ``instructions`` is the system prompt. Caching is automatic (no
markers); ``prompt_cache_retention: "24h"`` extends it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lore_gateway.compaction.detect import Flow, codex_flow
from lore_gateway.protocols.history_common import (
    INSTRUCTION_ROLES,
    Item,
    leading_instructions,
    message_text,
    retention_ttl,
    token_count,
)
from lore_gateway.routing import Family

# Item types the model produces besides its messages.
ASSISTANT_TYPES = ("function_call", "reasoning", "custom_tool_call", "local_shell_call")


class ResponsesHistory:
    family = Family.RESPONSES
    items_key = "input"
    instructions_file = "AGENTS.md"

    def lead_count(self, items: list[Any]) -> int:
        return leading_instructions(items)

    def is_user_text(self, item: Any) -> bool:
        return (isinstance(item, dict) and item.get("role") == "user"
                and item.get("type", "message") == "message")

    def is_tool_output(self, item: Any) -> bool:
        return isinstance(item, dict) and str(item.get("type", "")).endswith("_call_output")

    def is_assistant_side(self, item: Item) -> bool:
        return item.get("role") == "assistant" or item.get("type") in ASSISTANT_TYPES

    def is_system(self, item: Any) -> bool:
        return (isinstance(item, dict) and item.get("type", "message") == "message"
                and item.get("role") in INSTRUCTION_ROLES)

    def user_text(self, item: Any) -> str:
        return message_text(item)

    def thinking_mode(self, payload: Mapping[str, Any]) -> str | None:
        return None

    def shrink_output(self, item: Item, shrink: Callable[[str], str | None]) -> Item:
        output = item.get("output")
        if isinstance(output, str) and (new := shrink(output)) is not None:
            return {**item, "output": new}
        return item

    def without_tool_results(self, item: Item) -> Item | None:
        return None

    def user_message(self, text: str, cache_control: Item | None = None) -> Item:
        return {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text}]}

    def assistant_message(self, text: str) -> Item:
        return {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": text}]}

    def update_items(self, text: str, ack: str) -> list[Item]:
        return [_developer(text)]

    def add_system_text(self, payload: dict[str, Any], text: str) -> dict[str, Any]:
        """After ``instructions`` when there are some, else a developer item
        after the leading instructions."""
        instructions = payload.get("instructions")
        if isinstance(instructions, str) and instructions:
            return {**payload, "instructions": instructions + "\n\n" + text}
        item = _developer(text)
        items = payload.get("input")
        if isinstance(items, str):
            return {**payload, "input": [item, self.user_message(items)]}
        if isinstance(items, list):
            at = leading_instructions(items)
            return {**payload, "input": [*items[:at], item, *items[at:]]}
        return payload

    def cache_ttl(self, payload: Mapping[str, Any]) -> float:
        return retention_ttl(payload)

    def cache_marker(self, payload: Mapping[str, Any], tail: list[Any]) -> Item | None:
        return None

    def fit_breakpoints(self, payload: Mapping[str, Any], items: list[Any],
                        start: int) -> list[Any]:
        return items

    def compaction_flow(self, payload: Mapping[str, Any],
                        headers: Mapping[str, str]) -> Flow | None:
        return codex_flow(payload, headers)

    def usage_scaler(self) -> ResponsesUsageScaler:
        return ResponsesUsageScaler()


class ResponsesUsageScaler:
    """``input_tokens`` includes cached tokens, ``total_tokens`` is their sum
    with the output; each ``*_details`` figure scales with its total."""

    __slots__ = ()

    def scale(self, usage: dict[str, Any], factor: Callable[[int], float | None],
              event: object) -> bool:
        total = token_count(usage.get("total_tokens")) or (
            token_count(usage.get("input_tokens")) + token_count(usage.get("output_tokens")))
        chosen = factor(total)
        if chosen is None:
            return False
        for key in ("input_tokens", "output_tokens"):
            if isinstance(usage.get(key), int):
                usage[key] = int(usage[key] * chosen)
        for key in ("input_tokens_details", "output_tokens_details"):
            details = usage.get(key)
            if isinstance(details, dict):
                for name, value in details.items():
                    if isinstance(value, int):
                        details[name] = int(value * chosen)
        usage["total_tokens"] = (token_count(usage.get("input_tokens"))
                                 + token_count(usage.get("output_tokens")))
        return True


def _developer(text: str) -> Item:
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}


RESPONSES = ResponsesHistory()
