"""What the history adapters share: plain-dict reads every protocol's history needs.

Each ``history_<protocol>`` module adds only its own shapes on top of these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Item = dict[str, Any]

# How long a provider keeps a prefix cached after its last use (wave2-memory §5):
# Anthropic's default ephemeral TTL is 5 minutes (1 h when the request asks for
# it); OpenAI's in-memory retention is 5-10 minutes of inactivity, so the
# shorter figure is the safe one (a prefix we think cold is then really cold).
PROMPT_CACHE_TTL_S = 300.0
# OpenAI's extended retention (``prompt_cache_retention: "24h"``).
OPENAI_24H_TTL_S = 86_400.0
INSTRUCTION_ROLES = ("system", "developer")


def retention_ttl(payload: Mapping[str, Any]) -> float:
    """The cache lifetime a request's ``prompt_cache_retention`` asks for."""
    if payload.get("prompt_cache_retention") == "24h":
        return OPENAI_24H_TTL_S
    return PROMPT_CACHE_TTL_S


def leading_instructions(items: list[Any]) -> int:
    """How many items at the start are system/developer instructions."""
    count = 0
    for item in items:
        if not isinstance(item, dict) or item.get("role") not in INSTRUCTION_ROLES:
            break
        count += 1
    return count


def message_text(item: Any) -> str:
    """The text of a message (or an Anthropic block holding ``content``): a
    string, or its ``text``/``input_text`` parts joined by newlines."""
    if not isinstance(item, dict):
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content
                         if isinstance(b, dict) and b.get("type") in ("text", "input_text"))
    return ""


def token_count(value: Any) -> int:
    """A usage figure as an int (0 for anything that is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class UnscaledUsage:
    """Leaves usage as reported: the scaler of a protocol no compacting agent
    speaks (Chat, Gemini), for which ``compaction.service.usage_cap`` makes no cap."""

    __slots__ = ()

    def scale(self, usage: dict[str, Any], factor: Callable[[int], float | None],
              event: object) -> bool:
        return False


UNSCALED = UnscaledUsage()
