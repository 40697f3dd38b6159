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
                raise ValueError("recovery answer has too many item ids")
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
