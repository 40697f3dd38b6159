"""The item state of a Responses stream (sans-IO): output items, the data events
applied to them (text, arguments, summaries), and snapshots of items as they stand.

One implementation for every reader of Responses item events: the stream
accumulator (:mod:`responses_stream`, which adds lifecycle and terminals) and the
live recall interceptor (one per round, :mod:`lore_gateway.recall.responses`), so
the sparse Codex handling (lore-spec D.5: implicit items, missing indices, late or
rotating identities) is written once. ``public`` mode checks the strict lifecycle
of lore-spec D.4; see :mod:`responses_stream` for both modes.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.responses_data import apply_data
from lore_gateway.protocols.responses_model import (
    MAX_OUTPUT_INDEX,
    TOOL_ITEM_TYPES,
    Item,
    Mode,
    as_index,
    as_str,
    conflicts,
    item_kind,
)

# ``response.output_text.annotation.added`` shares the text prefix but carries no text.
_ANNOTATION_PREFIX = "response.output_text.annotation"


class ResponsesItems:
    """Output items of one Responses stream, by output index."""

    def __init__(self, mode: Mode, max_text_chars: int | None) -> None:
        self.mode: Mode = mode
        self._max_text = max_text_chars
        self._items: dict[int, Item] = {}
        self._by_id: dict[str, int] = {}
        self._next_index = 0
        self._touched: Item | None = None

    @property
    def strict(self) -> bool:
        return self.mode == "public"

    # --- item state for the live recall interceptor -----------------------------------

    def apply_item_event(self, name: str, payload: dict[str, Any]) -> Item | None:
        """Apply one ``output_item.*`` or data event; return the item it concerned
        (None for an event that carries nothing to keep).

        The live recall interceptor keeps each round's items here, so sparse
        Codex streams (implicit items, missing indices, late identities) are
        handled in this one place; lifecycle and terminals stay the
        interceptor's, as it rebuilds them for the client.
        """
        self._touched = None
        if name == "response.output_item.added":
            self._apply_item_added(name, payload)
        elif name == "response.output_item.done":
            self._apply_item_done(name, payload)
        else:
            self._apply_data(name, payload)
        return self._touched

    def snapshot(self, item: Item) -> dict[str, Any]:
        """One item as it stands (a copy): the done item, or the added one filled in."""
        return dict(self._final_item(item))

    # --- items ----------------------------------------------------------------------

    def _allocate_index(self) -> int:
        idx = self._next_index
        if idx >= MAX_OUTPUT_INDEX:
            raise ProtocolError("Responses output_index overflow")
        return idx

    def _event_index(self, name: str, payload: dict[str, Any]) -> int | None:
        if "output_index" not in payload or payload["output_index"] is None:
            if self.strict:
                raise ProtocolError(f"invalid Responses output_index for {name}")
            return None
        idx = as_index(payload["output_index"])
        if idx is None or not 0 <= idx < MAX_OUTPUT_INDEX:
            raise ProtocolError(f"invalid Responses output_index for {name}")
        return idx

    def _new_item(self, idx: int, raw: dict[str, Any], *, done: bool = False) -> Item:
        item = Item(index=idx, type=as_str(raw.get("type")), raw=dict(raw))
        item.id = as_str(raw.get("id"))
        item.call_id = as_str(raw.get("call_id"))
        item.name = as_str(raw.get("name"))
        if item.type == "function_call":
            item.args = as_str(raw.get("arguments"))
        elif item.type == "custom_tool_call":
            item.args = as_str(raw.get("input"))
        content = raw.get("content")
        if isinstance(content, list):
            item.parts = {i: dict(p) for i, p in enumerate(content) if isinstance(p, dict)}
        summary = raw.get("summary")
        if isinstance(summary, list):
            item.summaries = {i: dict(p) for i, p in enumerate(summary) if isinstance(p, dict)}
        item.done = done
        item.args_done = done
        self._items[idx] = item
        self._next_index = max(self._next_index, idx + 1)
        if item.id:
            self._by_id.setdefault(item.id, idx)
        self._touched = item
        return item

    def _implicit(self, kind: str, idx: int | None, item_id: str) -> Item:
        """Create the item a sparse Codex data event refers to (lore-spec D.5)."""
        raw: dict[str, Any] = {"type": kind, "id": item_id}
        if kind == "message":
            raw.update(role="assistant", content=[])
        elif kind == "function_call":
            raw.update(call_id="", name="", arguments="")
        elif kind == "custom_tool_call":
            raw.update(call_id="", name="", input="")
        elif kind == "reasoning":
            raw["summary"] = []
        item = self._new_item(self._allocate_index() if idx is None else idx, raw)
        item.implicit = True
        return item

    def _apply_item_added(self, name: str, payload: dict[str, Any]) -> None:
        raw = payload.get("item")
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise ProtocolError(f"malformed Responses {name}")
        idx = self._event_index(name, payload)
        if idx is None:
            idx = self._allocate_index()
        existing = self._items.get(idx)
        if existing is not None:
            if self.strict or not existing.implicit or existing.done:
                raise ProtocolError(f"duplicate Responses output_index {idx}")
            existing.raw.update({k: v for k, v in raw.items() if v not in ("", None, [])})
            self._reconcile_identity(existing, raw)
            self._touched = existing
            return
        if self.strict:
            self._check_public_item(idx, raw)
        self._new_item(idx, raw)

    def _check_public_item(self, idx: int, raw: dict[str, Any]) -> None:
        item_id = raw.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise ProtocolError(f"malformed Responses item identity for index {idx}")
        if raw["type"] == "function_call":
            for key in ("call_id", "name"):
                if not isinstance(raw.get(key), str) or not raw[key]:
                    raise ProtocolError(f"malformed Responses item identity for index {idx}")
            if not isinstance(raw.get("arguments"), str):
                raise ProtocolError(f"malformed Responses item identity for index {idx}")
            if raw["call_id"] == item_id:
                raise ProtocolError("duplicate Responses identity within output item")
        if raw["type"] == "message" and raw.get("role") != "assistant":
            raise ProtocolError(f"Responses message item at index {idx} is not from the assistant")
        if item_id in self._by_id:
            raise ProtocolError("duplicate Responses item identity")

    def _apply_item_done(self, name: str, payload: dict[str, Any]) -> None:
        raw = payload.get("item")
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise ProtocolError(f"malformed Responses {name}")
        idx = self._event_index(name, payload)
        item = self._items.get(idx) if idx is not None else self._find_sparse(raw["type"], raw)
        if item is None:
            if self.strict:
                raise ProtocolError(
                    f"Responses {name} arrived before output_item.added for index {idx}"
                )
            # A done without an added seeds the item from the done (lore-spec D.5).
            self._new_item(self._allocate_index() if idx is None else idx, raw, done=True)
            return
        if item.done:
            raise ProtocolError(f"Responses event after output_item.done for index {item.index}")
        if self.strict:
            if (
                raw["type"] != item.type
                or raw.get("id") != item.id
                or (
                    item.type == "function_call"
                    and (raw.get("call_id") != item.call_id or raw.get("name") != item.name)
                )
            ):
                raise ProtocolError(
                    f"Responses output_item.done changed item identity for index {item.index}"
                )
            if item.active_part is not None:
                raise ProtocolError(
                    f"Responses stream ended before output_item.done for index {item.index}"
                )
            if item.type == "message" and not isinstance(raw.get("content"), list):
                raise ProtocolError(
                    f"Responses message output_item.done has no content for index {item.index}"
                )
        self._close_item(item, raw)
        self._touched = item

    def _find_sparse(self, kind: str, raw: dict[str, Any]) -> Item | None:
        item_id = as_str(raw.get("id"))
        if item_id and item_id in self._by_id:
            return self._items[self._by_id[item_id]]
        open_items = [i for i in self._items.values() if not i.done and i.type == kind]
        unbound = [i for i in open_items if not i.id]
        if len(open_items) == 1:
            return open_items[0]
        if len(unbound) == 1:
            return unbound[0]
        if open_items:
            raise ProtocolError(f"ambiguous Responses item for {kind}")
        return None

    def _reconcile_identity(self, item: Item, raw: dict[str, Any]) -> None:
        """Codex: earlier and later identities must agree when both are known;
        otherwise the known one wins. Message and reasoning ids may rotate
        (Copilot), so only tool identities are held to this."""
        for key in ("call_id", "name"):
            value = as_str(raw.get(key))
            if item.type in TOOL_ITEM_TYPES and conflicts(getattr(item, key), value):
                raise ProtocolError(
                    f"Responses output_item.done changed item identity for index {item.index}"
                )
            if value and not getattr(item, key):
                setattr(item, key, value)
        item_id = as_str(raw.get("id"))
        if item_id and not item.id:
            item.id = item_id
            self._by_id.setdefault(item_id, item.index)

    def _close_item(self, item: Item, raw: dict[str, Any]) -> None:
        """The done item replaces the added one, filled from what was streamed."""
        item.settle()
        if not self.strict:
            self._reconcile_identity(item, raw)
        final = dict(raw)
        if item.type in TOOL_ITEM_TYPES:
            key = "arguments" if item.type == "function_call" else "input"
            if item.call_id and not final.get("call_id"):
                final["call_id"] = item.call_id
            if item.name and not final.get("name"):
                final["name"] = item.name
            if not as_str(final.get(key)) and item.args:
                final[key] = item.args
            item.args = as_str(final.get(key))
            item.args_done = True
        elif item.type == "message" and not final.get("content") and item.parts:
            final["content"] = [item.parts[i] for i in sorted(item.parts)]
        elif item.type == "reasoning" and not final.get("summary") and item.summaries:
            final["summary"] = [item.summaries[i] for i in sorted(item.summaries)]
        item.raw = final
        item.active_part = None
        item.done = True

    # --- data events ----------------------------------------------------------------

    def _locate(self, name: str, payload: dict[str, Any]) -> Item:
        kind = item_kind(name) or "message"
        item_id = as_str(payload.get("item_id"))
        idx = self._event_index(name, payload)
        if idx is not None:
            item = self._items.get(idx)
            if item is None:
                if self.strict:
                    raise ProtocolError(
                        f"Responses {name} arrived before output_item.added for index {idx}"
                    )
                item = self._implicit(kind, idx, item_id)
        else:
            found = self._find_sparse(kind, {"id": item_id})
            item = found if found is not None else self._implicit(kind, None, item_id)
        if item.done:
            raise ProtocolError(f"Responses event after output_item.done for index {item.index}")
        if item_id and item_id != item.id:
            if not item.id:
                item.id = item_id
                self._by_id.setdefault(item_id, item.index)
            elif self.strict:
                raise ProtocolError(f"Responses {name} changed item_id for index {item.index}")
        self._touched = item
        return item

    def _apply_data(self, name: str, payload: dict[str, Any]) -> None:
        if item_kind(name) is None or name.startswith(_ANNOTATION_PREFIX):
            return  # other response.* events (annotations, tool progress) carry nothing to keep
        apply_data(name, payload, self._locate(name, payload), strict=self.strict,
                   max_text=self._max_text)

    def _final_item(self, item: Item) -> dict[str, Any]:
        """The item as it stands: the done item, or the added one filled in."""
        item.settle()
        if item.done:
            return item.raw
        raw = dict(item.raw)
        if item.id:
            raw["id"] = item.id
        if item.type == "message" or item.parts:
            raw["content"] = [item.parts[i] for i in sorted(item.parts)]
        if item.type == "function_call":
            raw.update(call_id=item.call_id, name=item.name, arguments=item.args)
        elif item.type == "custom_tool_call":
            raw.update(call_id=item.call_id, name=item.name, input=item.args)
        if item.type == "reasoning" and item.summaries:
            raw["summary"] = [item.summaries[i] for i in sorted(item.summaries)]
        return raw
