"""Which requests are the agent's coding turns, and which are side channels.

Title and topic generation, Claude Code's permission classifier and other
helper calls share the session's headers but are not the conversation: they get
no knowledge, are not distilled and start no background work (wave2-memory
§4.1; Lore #1161, #1700). A coding turn carries tools and a real system prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# A coding agent's instructions run to thousands of characters; a title or
# classifier prompt to a few hundred.
MIN_SYSTEM_CHARS = 400
# Claude Code's classifier asks for an XML verdict and stops at its closing tag.
_CLASSIFIER_STOPS = ("</block>", "</severity>")


def is_coding_turn(family: str, payload: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    if "x-lore-worker" in headers:
        return False
    metadata = headers.get("x-codex-turn-metadata")
    if metadata:
        try:
            kind = json.loads(metadata).get("request_kind")
        except (ValueError, AttributeError):
            kind = None
        if kind not in (None, "turn"):
            return False
    stops = payload.get("stop_sequences")
    if isinstance(stops, list) and any(str(s) in _CLASSIFIER_STOPS for s in stops):
        return False
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return False
    return len(_system_text(family, payload)) >= MIN_SYSTEM_CHARS


def _system_text(family: str, payload: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for key in ("system", "instructions"):
        parts.extend(_texts(payload.get(key)))
    items = payload.get("input" if family == "responses" else "messages")
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("role") in ("system", "developer"):
                parts.extend(_texts(item.get("content")))
    return "\n".join(parts)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(p.get("text", "")) for p in value if isinstance(p, dict)]
    return []
