"""Chat Completions history (``messages``), for the features (pure).

Tool results are ``role: tool`` messages; system and developer messages before
the first user message are the leading instructions. Caching is automatic (no
markers). No compacting agent speaks Chat, so it carries no compaction request
and its usage is never scaled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lore_gateway.compaction.detect import Flow
from lore_gateway.protocols.history_common import (
    INSTRUCTION_ROLES,
    UNSCALED,
    Item,
    UnscaledUsage,
    leading_instructions,
    message_text,
    retention_ttl,
)
from lore_gateway.routing import Family


class ChatHistory:
    family = Family.CHAT
    items_key = "messages"
    instructions_file = "AGENTS.md"

    def lead_count(self, items: list[Any]) -> int:
        return leading_instructions(items)

    def is_user_text(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("role") == "user"

    def is_tool_output(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("role") == "tool"

    def is_assistant_side(self, item: Item) -> bool:
        return item.get("role") == "assistant"

    def is_system(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("role") in INSTRUCTION_ROLES

    def user_text(self, item: Any) -> str:
        return message_text(item)

    def thinking_mode(self, payload: Mapping[str, Any]) -> str | None:
        return None

    def shrink_output(self, item: Item, shrink: Callable[[str], str | None]) -> Item:
        content = item.get("content")
        if isinstance(content, str) and (new := shrink(content)) is not None:
            return {**item, "content": new}
        return item

    def without_tool_results(self, item: Item) -> Item | None:
        return None

    def user_message(self, text: str, cache_control: Item | None = None) -> Item:
        return {"role": "user", "content": text}

    def assistant_message(self, text: str) -> Item:
        return {"role": "assistant", "content": text}

    def update_items(self, text: str, ack: str) -> list[Item]:
        return [{"role": "system", "content": text}]

    def add_system_text(self, payload: dict[str, Any], text: str) -> dict[str, Any]:
        """A system message after the leading instructions."""
        items = payload.get("messages")
        if not isinstance(items, list):
            return payload
        at = leading_instructions(items)
        return {**payload, "messages": [*items[:at], {"role": "system", "content": text},
                                        *items[at:]]}

    def cache_ttl(self, payload: Mapping[str, Any]) -> float:
        return retention_ttl(payload)

    def cache_marker(self, payload: Mapping[str, Any], tail: list[Any]) -> Item | None:
        return None

    def fit_breakpoints(self, payload: Mapping[str, Any], items: list[Any],
                        start: int) -> list[Any]:
        return items

    def compaction_flow(self, payload: Mapping[str, Any],
                        headers: Mapping[str, str]) -> Flow | None:
        return None

    def usage_scaler(self) -> UnscaledUsage:
        return UNSCALED


CHAT = ChatHistory()
