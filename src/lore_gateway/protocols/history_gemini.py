"""Gemini ``generateContent`` history (``contents``), for the features (pure).

Roles are ``user`` and ``model``. A tool result is a ``user`` content of
``functionResponse`` parts, which must come right after the ``model`` content
whose ``functionCall`` parts it answers, one response per call (the API's
400s: "function response turn comes immediately after a function call turn",
"the number of function response parts is equal to the number of function
call parts"). Instructions are not in the history: they are the request's
``systemInstruction``, so no item leads. Caching is implicit (no markers);
no compacting agent speaks Gemini yet, so it carries no compaction request and
its usage is never scaled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lore_gateway.compaction.detect import Flow
from lore_gateway.protocols.gemini import (
    MODEL_ROLE,
    USER_ROLE,
    function_response,
    parts_of,
    parts_text,
    role_of,
    system_key,
)
from lore_gateway.protocols.history_common import PROMPT_CACHE_TTL_S, UNSCALED, Item, UnscaledUsage
from lore_gateway.routing import Family


def _is_user(item: Any) -> bool:
    return isinstance(item, dict) and role_of(item) == USER_ROLE


def _has_response(item: Any) -> bool:
    return any(function_response(p) is not None for p in parts_of(item))


class GeminiHistory:
    family = Family.GEMINI
    items_key = "contents"
    instructions_file = "GEMINI.md"

    def lead_count(self, items: list[Any]) -> int:
        return 0

    def is_user_text(self, item: Any) -> bool:
        return _is_user(item) and not _has_response(item)

    def is_tool_output(self, item: Any) -> bool:
        return _is_user(item) and _has_response(item)

    def is_assistant_side(self, item: Item) -> bool:
        return role_of(item) == MODEL_ROLE

    def is_system(self, item: Any) -> bool:
        return False

    def user_text(self, item: Any) -> str:
        return parts_text(parts_of(item)) if _is_user(item) else ""

    def thinking_mode(self, payload: Mapping[str, Any]) -> str | None:
        return None

    def shrink_output(self, item: Item, shrink: Callable[[str], str | None]) -> Item:
        """Each function response's string fields (``output``, ``error``, ...)."""
        changed = False
        parts: list[Any] = []
        for part in item.get("parts") or []:
            answer = function_response(part) if isinstance(part, dict) else None
            response = answer.get("response") if answer is not None else None
            if answer is not None and isinstance(response, dict):
                new = {k: (shrink(v) if isinstance(v, str) else None)
                       for k, v in response.items()}
                if any(v is not None for v in new.values()):
                    response = {k: v if new[k] is None else new[k]
                                for k, v in response.items()}
                    key = "functionResponse" if "functionResponse" in part \
                        else "function_response"
                    part = {**part, key: {**answer, "response": response}}
                    changed = True
            parts.append(part)
        return {**item, "parts": parts} if changed else item

    def without_tool_results(self, item: Item) -> Item | None:
        rest = [p for p in item.get("parts") or []
                if not (isinstance(p, dict) and function_response(p) is not None)]
        return {**item, "parts": rest} if rest else None

    def user_message(self, text: str, cache_control: Item | None = None) -> Item:
        return {"role": USER_ROLE, "parts": [{"text": text}]}

    def assistant_message(self, text: str) -> Item:
        return {"role": MODEL_ROLE, "parts": [{"text": text}]}

    def update_items(self, text: str, ack: str) -> list[Item]:
        # A user/model pair, so the next user content (or function responses,
        # which must follow their call) keeps its place.
        return [self.user_message(text), self.assistant_message(ack)]

    def add_system_text(self, payload: dict[str, Any], text: str) -> dict[str, Any]:
        """A text part at the end of ``systemInstruction`` (made if missing)."""
        key = system_key(payload)
        system = payload.get(key)
        if isinstance(system, str):  # the API also reads a bare string
            new: Item = {"parts": [{"text": system}, {"text": text}]}
        elif isinstance(system, dict):
            new = {**system, "parts": [*parts_of(system), {"text": text}]}
        else:
            new = {"parts": [{"text": text}]}
        return {**payload, key: new}

    def cache_ttl(self, payload: Mapping[str, Any]) -> float:
        # Implicit caching keeps a prefix minutes, like the others' default.
        return PROMPT_CACHE_TTL_S

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


GEMINI = GeminiHistory()
