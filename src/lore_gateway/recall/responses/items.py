"""The item side of a recall-watched Responses round: every item event goes to
the round's :class:`~lore_gateway.protocols.responses_stream.ResponsesAccumulator`
(which owns the item state, implicit Codex items included); this layer decides
whether the event's item is hidden (a recall) or goes on to the client view.
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.recall.responses.emission import ClientEmission
from lore_gateway.recall.responses.round import Action, RoundItem
from lore_gateway.sse import SSEEvent

_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})


class ItemTracking(ClientEmission):
    """Every event applied to its round's items, forwarded, deferred or hidden."""

    _codex: bool

    def _item_event(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> list[Action]:
        item = self._apply(name, payload)
        if item is not None and item.recall:
            self._charge_deferred(len(event.raw))
            self._renumber = True
            return []
        return self._emit_or_defer(event, name, payload)

    def _apply(self, name: str, payload: dict[str, Any]) -> RoundItem | None:
        """Apply the event to the accumulator; the view of the item it concerned."""
        rnd = self._round
        state = rnd.acc.apply_item_event(name, payload)
        if state is None:
            return self._indexed(payload)
        item = rnd.items.get(state.index)
        if item is None:
            item = rnd.items[state.index] = RoundItem(state, rnd.acc)
            item.classify(self._codex)
            rnd.classified()
            self._retain(len(orjson.dumps(state.raw)))
        if name in _ITEM_EVENTS:
            turned_recall = item.reclassify(self._codex)
            rnd.classified()
            if turned_recall:
                # The deferred events of this item were a recall after all.
                self._drop_deferred_of(item.index)
        return item

    def _indexed(self, payload: dict[str, Any]) -> RoundItem | None:
        """The item an event with nothing to accumulate refers to, if known."""
        index = payload.get("output_index")
        if isinstance(index, int):
            return self._round.items.get(index)
        item_id = payload.get("item_id")
        if isinstance(item_id, str) and item_id:
            return next((i for i in self._round.items.values() if i.state.id == item_id), None)
        return None
