"""The item state of a recall-watched Responses round: which item an event is
about (implicit items for sparse Codex streams included), applied to that item's
snapshot, and whether it is hidden (a recall) or goes on to the client view.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.responses.emission import ClientEmission
from lore_gateway.recall.responses.round import Action, RoundItem
from lore_gateway.sse import SSEEvent


class ItemTracking(ClientEmission):
    """Every event applied to its round item, forwarded, deferred or hidden."""

    _codex: bool

    def _locate(self, name: str, payload: dict[str, Any]) -> RoundItem:
        rnd = self._round
        index = payload.get("output_index")
        item_id = payload.get("item_id")
        if not isinstance(index, int):
            if isinstance(item_id, str) and item_id in rnd.by_item_id:
                index = rnd.by_item_id[item_id]
            elif rnd.last_index >= 0:
                index = rnd.last_index
            else:
                index = 0
        if index < 0 or index >= 100_000:
            raise ProtocolError(f"invalid Responses output_index for {name}")
        item = rnd.items.get(index)
        if item is None:
            # Codex may send data events or a done without an added: an implicit item.
            seed = payload.get("item") if isinstance(payload.get("item"), dict) else None
            if seed is None:
                implicit = "function_call" if "arguments" in name else "message"
                seed = {"type": implicit, "id": item_id or ""}
                if implicit == "message":
                    seed["role"] = "assistant"
                else:
                    seed.update(call_id="", name="", arguments="")
            item = self._add_item(index, seed)
        return item

    def _add_item(self, index: int, raw: dict[str, Any]) -> RoundItem:
        rnd = self._round
        if index in rnd.items:
            raise ProtocolError(f"duplicate Responses output_item.added for index {index}")
        kind = str(raw.get("type") or "")
        item = RoundItem(index=index, raw=dict(raw), kind=kind)
        item.classify(self._codex)
        rnd.items[index] = item
        rnd.last_index = max(rnd.last_index, index)
        if isinstance(raw.get("id"), str) and raw["id"]:
            rnd.by_item_id[raw["id"]] = index
        self._retain(len(orjson.dumps(raw)))
        return item

    def _item_event(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> list[Action]:
        if name == "response.output_item.added":
            raw = payload.get("item")
            if not isinstance(raw, dict):
                raise ProtocolError("malformed Responses event response.output_item.added")
            index = payload.get("output_index")
            if not isinstance(index, int):
                index = self._round.last_index + 1
            item = self._add_item(index, raw)
        else:
            item = self._locate(name, payload)
            self._apply(item, name, payload)
        if item.recall:
            self._charge_deferred(len(event.raw))
            self._renumber = True
            return []
        return self._emit_or_defer(event, name, payload, item)

    def _apply(self, item: RoundItem, name: str, payload: dict[str, Any]) -> None:
        if item.apply(name, payload, self._codex):
            # The deferred events of this item were a recall after all.
            self._drop_deferred_of(item.index)
