"""Fresh identities for a recovered Responses answer (lore-spec C.7).

A recovery answer is a second attempt at the same turn. Its items must not
reuse the ids of anything the upstream produced before (the failed
continuation's, which the gateway may already have seen and stored), so every
item id and call id is replaced by a gateway-made one: ``msg_lore_recovery_<uuid>``,
``rs_…``, ``fc_…``, ``call_lore_recovery_<uuid>``. The same upstream id always
maps to the same fresh id, so an item's events stay consistent.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.sse import SSEEvent, encode_event

_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}
# One recovery answer has a handful of items; this only bounds a hostile stream.
MAX_IDS = 4096


class FreshIds:
    """Upstream id → fresh id, for one recovery answer."""

    def __init__(self) -> None:
        self._map: dict[str, str] = {}

    def _fresh(self, old: str, prefix: str) -> str:
        new = self._map.get(old)
        if new is None:
            if len(self._map) >= MAX_IDS:
                # A ProtocolError, so the interceptor fails the stream properly
                # (one response.failed) instead of the stream being cut.
                raise ProtocolError(f"recovery answer has more than {MAX_IDS} item ids")
            new = f"{prefix}_lore_recovery_{uuid.uuid4().hex}"
            self._map[old] = new
        return new

    def item(self, item: dict[str, Any]) -> dict[str, Any]:
        """A copy of an output item with fresh ``id`` and ``call_id``."""
        out = dict(item)
        if isinstance(out.get("id"), str) and out["id"]:
            out["id"] = self._fresh(out["id"], _PREFIX.get(str(out.get("type")), "item"))
        if isinstance(out.get("call_id"), str) and out["call_id"]:
            out["call_id"] = self._fresh(out["call_id"], "call")
        return out

    def payload(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A copy of one stream event's payload with its item ids replaced."""
        out = dict(payload)
        if isinstance(out.get("item"), dict):
            out["item"] = self.item(out["item"])
        item_id = out.get("item_id")
        if isinstance(item_id, str) and item_id:
            out["item_id"] = self._map.get(item_id) or self._fresh(item_id, "msg")
        return out

    def event(self, event: SSEEvent, name: str,
              payload: dict[str, Any]) -> tuple[SSEEvent, dict[str, Any]]:
        """The event re-encoded with fresh ids (unchanged when it names no item)."""
        fresh = self.payload(payload)
        if fresh == payload:
            return event, payload
        data = orjson.dumps(fresh)
        return SSEEvent(name, data.decode(), True, encode_event(name, data)), fresh


def _normalised(text: str) -> str:
    return " ".join(text.split())


def _message_text(item: dict[str, Any]) -> str:
    parts = item.get("content") if item.get("type") == "message" else None
    if not isinstance(parts, list):
        return ""
    return _normalised("".join(str(p.get("text") or "") for p in parts if isinstance(p, dict)))


def _call_key(item: dict[str, Any]) -> tuple[str, str] | None:
    if item.get("type") != "function_call":
        return None
    return str(item.get("name") or ""), str(item.get("arguments") or "")


def repeated_delivery(recovered: list[dict[str, Any]],
                      delivered: list[dict[str, Any]]) -> str | None:
    """Why a recovery answer would repeat what the client already has, or None.

    The recovery is a second attempt at a turn whose earlier output the client
    may already show; text that equals or merely restates (starts with) a
    delivered message, or a tool call with the same name and arguments as a
    delivered one, would appear twice (lore-spec C.7). Whitespace is normalised.
    """
    texts = [t for t in (_message_text(i) for i in delivered) if t]
    calls = {k for k in (_call_key(i) for i in delivered) if k is not None}
    for item in recovered:
        text = _message_text(item)
        if text and any(text.startswith(old) for old in texts):
            return "upstream recovery output repeated delivered text"
        key = _call_key(item)
        if key is not None and key in calls:
            return "upstream recovery output repeated a delivered tool call"
    return None
