"""Accumulate an OpenAI Responses event stream into the complete response (sans-IO).

Every event is applied, including ones a client would never display, because
storage and the recall loop need the whole output (lore-spec D.3). Two modes:

``public``
    The lifecycle OpenAI's public API promises, checked strictly (lore-spec D.4):
    ``response.created`` first, explicit indices, items opened before use,
    deltas that add up to their ``done`` text, a terminal whose output matches
    what was streamed. Used for ``/v1/responses``.
``codex``
    The ChatGPT Codex backend (and Copilot-style relays) stream sparsely
    (lore-spec D.5): indices and ids may be missing, items may appear only at
    ``output_item.done``, data events may arrive for items never added, ids
    may rotate, and the terminal may omit items. We normalise all of that
    instead of rejecting it, because Codex itself accepts it.

Errors raise :class:`ProtocolError` with the reference gateway's messages; the
accumulator is then unusable (like h11, it never limps on).
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.protocols.common import ProtocolError, TextBuffer, ToolCall
from lore_gateway.protocols.ratelimits import RATE_LIMITS_EVENT, RateLimitLog
from lore_gateway.protocols.responses_model import (
    INCOMPLETE_REASONS,
    LIFECYCLE_EVENTS,
    MAX_OUTPUT_INDEX,
    TERMINAL_EVENTS,
    TERMINAL_STATUSES,
    TOOL_ITEM_TYPES,
    Item,
    Mode,
    ResponsesResult,
    as_index,
    as_str,
    conflicts,
    decode_payload,
    item_kind,
    stop_reason_for,
)
from lore_gateway.protocols.usage import Usage, usage_from_responses, usage_to_responses
from lore_gateway.sse import SSEEvent

# ``response.output_text.annotation.added`` shares the text prefix but carries no text.
_ANNOTATION_PREFIX = "response.output_text.annotation"

class ResponsesAccumulator:
    """Applies Responses stream events; see the module docstring for the modes."""

    def __init__(self, mode: Mode = "public", *, max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the text kept per content part and per tool
        call's arguments (storage keeps a bounded share of a huge answer); it
        is for the lenient ``codex`` mode only, as strict checks need it all."""
        if max_text_chars is not None and mode == "public":
            raise ValueError("max_text_chars needs mode='codex'")
        self.mode: Mode = mode
        self._max_text = max_text_chars
        self._id = ""
        self._model = ""
        self._snapshot: dict[str, Any] = {}
        self._created = False
        self._terminal: str | None = None
        self._status: str | None = None
        self._incomplete_reason: str | None = None
        self._error: dict[str, Any] | None = None
        self._usage: Usage | None = None
        self._seq = -1
        self._items: dict[int, Item] = {}
        self._by_id: dict[str, int] = {}
        self._next_index = 0
        self.rate_limits = RateLimitLog()
        self.error_event: dict[str, Any] | None = None
        self._touched: Item | None = None

    @property
    def done(self) -> bool:
        """True once a terminal event was applied."""
        return self._terminal is not None

    @property
    def strict(self) -> bool:
        return self.mode == "public"

    # --- entry points ---------------------------------------------------------------

    def feed_event(self, ev: SSEEvent) -> None:
        """Apply one decoded SSE frame."""
        if ev.event == RATE_LIMITS_EVENT:
            try:
                rl: object = orjson.loads(ev.data)
            except ValueError:
                return  # non-JSON rate limits are dropped, never fatal (lore-spec D.1)
            if not self.done:
                self.rate_limits.append(rl)
            return
        payload = decode_payload(ev, "Responses")
        if payload is not None:
            self.feed_json(ev.event or as_str(payload.get("type")), payload)

    def feed_json(self, name: str, payload: dict[str, Any]) -> None:
        """Apply one event given as its name and decoded JSON payload."""
        if self._terminal is not None:
            if self.strict:
                raise ProtocolError(f"Responses event after terminal: {name}")
            return  # bytes after the first terminal are discarded
        if name == RATE_LIMITS_EVENT:
            self.rate_limits.append(payload)
            return
        if name == "error":
            self.error_event = payload
            return
        if not name.startswith("response."):
            return  # provider extras are forwarded, not accumulated
        if name == "response.created":
            if self._created:
                raise ProtocolError("duplicate response.created")
            self._created = True
        elif not self._created and self.strict:
            raise ProtocolError(f"Responses event before response.created: {name}")
        if self.strict:
            self._check_sequence(name, payload)
        if name in LIFECYCLE_EVENTS:
            self._apply_lifecycle(name, payload)
        elif name in TERMINAL_EVENTS:
            self._apply_terminal(name, payload)
        else:
            self.apply_item_event(name, payload)

    def close(self) -> None:
        """Signal the end of the stream; a stream must end with a terminal."""
        if self._terminal is None:
            raise ProtocolError("missing terminal response status")

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

    # --- lifecycle ------------------------------------------------------------------

    def _check_sequence(self, name: str, payload: dict[str, Any]) -> None:
        if "sequence_number" not in payload:
            return
        seq = as_index(payload["sequence_number"])
        if seq is None or seq < 0:
            raise ProtocolError(f"malformed Responses sequence_number at {name}")
        if seq <= self._seq:
            raise ProtocolError(f"Responses sequence_number did not increase at {name}")
        self._seq = seq

    def _apply_lifecycle(self, name: str, payload: dict[str, Any]) -> None:
        resp = payload.get("response")
        if not isinstance(resp, dict):
            raise ProtocolError(f"malformed Responses {name}")
        rid, model = as_str(resp.get("id")), as_str(resp.get("model"))
        if self.strict:
            if not rid or not model:
                raise ProtocolError(f"malformed Responses {name}")
            if resp.get("status") not in ("in_progress", "queued"):
                raise ProtocolError(f"Responses {name} has status {resp.get('status')!r}")
            if resp.get("output") != []:
                raise ProtocolError(f"{name} must start with empty output")
            if self._id and (rid != self._id or model != self._model):
                raise ProtocolError(f"Responses {name} changed response identity")
        # Ids are pinned to the first one seen: Copilot rotates them mid-stream.
        self._id = self._id or rid
        self._model = self._model or model
        self._snapshot = resp

    def _apply_terminal(self, name: str, payload: dict[str, Any]) -> None:
        resp = payload.get("response")
        if not isinstance(resp, dict):
            raise ProtocolError("malformed Responses terminal event")
        status = resp.get("status")
        if status is None:
            if self.strict:
                raise ProtocolError("missing Responses compatibility terminal status")
            status = {"response.incomplete": "incomplete", "response.failed": "failed"}.get(
                name, "completed"
            )
        if status not in TERMINAL_STATUSES:
            raise ProtocolError("Responses terminal event has nonterminal status")
        if not self._terminal_agrees(name, status):
            raise ProtocolError("Responses terminal event contradicts response status")
        rid, model = as_str(resp.get("id")), as_str(resp.get("model"))
        if self.strict and (rid != self._id or model != self._model):
            raise ProtocolError("malformed Responses terminal event")
        self._id = self._id or rid
        self._model = self._model or model
        details = resp.get("incomplete_details")
        reason = as_str(details.get("reason")) if isinstance(details, dict) else ""
        if self.strict and status == "incomplete" and reason not in INCOMPLETE_REASONS:
            raise ProtocolError(f"Responses terminal has unsupported incomplete reason {reason!r}")
        error = resp.get("error")
        if status in ("failed", "cancelled"):
            if (
                self.strict
                and status == "failed"
                and not (isinstance(error, dict) and isinstance(error.get("message"), str))
            ):
                raise ProtocolError("malformed Responses terminal event")
            self._error = error if isinstance(error, dict) else None
        output = resp.get("output")
        if output is not None and not isinstance(output, list):
            raise ProtocolError("Responses terminal output must be an array")
        if self.strict:
            if output is None and status == "completed":
                raise ProtocolError("Responses terminal output must be an array")
            if status in ("completed", "incomplete"):
                self._require_all_done()
            self._match_public_output(output or [])
        else:
            self._merge_codex_output(output or [])
            self._require_resolved_tools()
        if resp.get("usage") is not None:
            self._usage = usage_from_responses(resp["usage"])
        self._snapshot = resp
        self._status = status
        self._incomplete_reason = reason or None
        self._terminal = name

    def _terminal_agrees(self, name: str, status: str) -> bool:
        if name == "response.completed":
            return status == "completed" or (not self.strict and status == "incomplete")
        if name == "response.incomplete":
            return status == "incomplete"
        if name == "response.failed":
            return status in ("failed", "cancelled")
        return status in ("completed", "incomplete") or not self.strict  # response.done

    def _require_all_done(self) -> None:
        for idx in sorted(self._items):
            item = self._items[idx]
            if not item.done or item.active_part is not None:
                raise ProtocolError(
                    f"Responses stream ended before output_item.done for index {idx}"
                )

    def _match_public_output(self, output: list[Any]) -> None:
        streamed = [self._items[i] for i in sorted(self._items)]
        if len(output) != len(streamed):
            raise ProtocolError("Responses terminal output changed streamed item")
        for item, final in zip(streamed, output, strict=True):
            if not isinstance(final, dict):
                raise ProtocolError("malformed Responses terminal event")
            same = final.get("type") == item.type and as_str(final.get("id")) == item.id
            if item.type == "function_call":
                same = same and (
                    final.get("call_id") == item.call_id
                    and final.get("name") == item.name
                    and final.get("arguments") == item.raw.get("arguments")
                )
            elif item.type == "message":
                same = same and final.get("content") == item.raw.get("content")
            if not same:
                raise ProtocolError("Responses terminal output changed streamed item")

    def _merge_codex_output(self, output: list[Any]) -> None:
        """Codex terminals may omit items; the ones present must match in stream
        order, may complete an item whose done never came, or add one never streamed."""
        for streamed in self._items.values():
            streamed.matched = False
        for final in output:
            if not isinstance(final, dict) or not isinstance(final.get("type"), str):
                raise ProtocolError("malformed Responses terminal event")
            item = self._terminal_match(final)
            if item is None:
                self._new_item(self._allocate_index(), final, done=True).matched = True
                continue
            item.matched = True
            if not item.done:
                self._close_item(item, final)
            elif item.type in TOOL_ITEM_TYPES and (
                conflicts(item.call_id, final.get("call_id"))
                or conflicts(item.name, final.get("name"))
            ):
                raise ProtocolError("Responses terminal output changed streamed item")

    def _terminal_match(self, final: dict[str, Any]) -> Item | None:
        fid = as_str(final.get("id"))
        if fid and fid in self._by_id:
            return self._items[self._by_id[fid]]
        for idx in sorted(self._items):
            item = self._items[idx]
            if not item.matched and item.type == final["type"]:
                return item
        return None

    def _require_resolved_tools(self) -> None:
        for item in self._items.values():
            if item.type in TOOL_ITEM_TYPES and not (item.name or item.raw.get("name")):
                raise ProtocolError("Responses terminal left sparse function identity unresolved")

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
        item = self._locate(name, payload)
        if name.startswith("response.content_part."):
            self._apply_part(name, payload, item)
        elif name.startswith(("response.output_text.", "response.refusal.")):
            self._apply_text(name, payload, item)
        elif name.startswith(
            ("response.function_call_arguments.", "response.custom_tool_call_input.")
        ):
            self._apply_arguments(name, payload, item)
        elif name.startswith("response.reasoning_text."):
            self._apply_text(name, payload, item)
        else:
            self._apply_summary(name, payload, item)

    def _content_index(self, name: str, payload: dict[str, Any], item: Item) -> int:
        ci = as_index(payload.get("content_index"))
        if ci is None or ci < 0:
            if self.strict:
                raise ProtocolError(
                    f"Responses {name} requires content_index for index {item.index}"
                )
            if item.active_part is not None:
                return item.active_part
            return len(item.parts) if name.endswith(".added") or not item.parts else max(item.parts)
        return ci

    def _apply_part(self, name: str, payload: dict[str, Any], item: Item) -> None:
        ci = self._content_index(name, payload, item)
        part = payload.get("part")
        if not isinstance(part, dict):
            raise ProtocolError(f"malformed Responses {name}")
        item.settle()
        for key in [k for k in item.texts if k[0] == ci]:
            del item.texts[key]
        if name.endswith(".added"):
            if self.strict and item.active_part is not None:
                raise ProtocolError(
                    f"Responses {name} while a content part is active for index {item.index}"
                )
            if self.strict and ci in item.parts:
                raise ProtocolError(f"duplicate Responses content part {ci} for index {item.index}")
            item.parts[ci] = dict(part)
            item.active_part = ci
        else:
            if self.strict and item.active_part != ci:
                raise ProtocolError(
                    f"Responses {name} does not match the active content part "
                    f"for index {item.index}"
                )
            item.parts[ci] = dict(part)
            item.closed_parts.add(ci)
            item.active_part = None

    def _apply_text(self, name: str, payload: dict[str, Any], item: Item) -> None:
        ci = self._content_index(name, payload, item)
        key = "refusal" if name.startswith("response.refusal.") else "text"
        part_type = {"refusal": "refusal"}.get(key) or (
            "reasoning_text" if name.startswith("response.reasoning_text.") else "output_text"
        )
        misplaced = item.active_part != ci or ci in item.closed_parts
        if self.strict and item.type == "message" and misplaced:
            raise ProtocolError(
                f"Responses {name} does not match the active content part for index {item.index}"
            )
        part = item.parts.setdefault(ci, {"type": part_type, key: ""})
        if name.endswith(".delta"):
            delta = payload.get("delta")
            if not isinstance(delta, str):
                raise ProtocolError(f"malformed Responses {name}")
            buf = item.texts.get((ci, key))
            if buf is None:
                buf = item.texts[(ci, key)] = TextBuffer(as_str(part.get(key)), self._max_text)
            buf.append(delta)
            return
        text = payload.get(key)
        if not isinstance(text, str):
            raise ProtocolError(f"malformed Responses {name}")
        item.settle()
        if self.strict and text != as_str(part.get(key)):
            raise ProtocolError(
                f"Responses {name} text does not match streamed deltas for index {item.index}"
            )
        item.texts.pop((ci, key), None)
        part[key] = text

    def _apply_arguments(self, name: str, payload: dict[str, Any], item: Item) -> None:
        key = "input" if item.type == "custom_tool_call" else "arguments"
        if item.args_done:
            raise ProtocolError(f"Responses {name} after arguments done for index {item.index}")
        if name.endswith(".delta"):
            delta = payload.get("delta")
            if not isinstance(delta, str):
                raise ProtocolError(f"malformed Responses {name}")
            if item.args_buf is None:
                item.args_buf = TextBuffer(limit=self._max_text)
            item.args_buf.append(delta)
            item.args_streamed = True
            return
        final = payload.get(key)
        if not isinstance(final, str):
            raise ProtocolError(f"malformed Responses {name}")
        item.settle()
        item.args_buf = None
        if self.strict and item.args_streamed and final != item.args:
            raise ProtocolError(
                f"Responses {name} arguments do not match streamed deltas for index {item.index}"
            )
        item.args = final
        item.args_done = True
        if not item.name and as_str(payload.get("name")):
            item.name = as_str(payload.get("name"))

    def _apply_summary(self, name: str, payload: dict[str, Any], item: Item) -> None:
        si = as_index(payload.get("summary_index"))
        if si is None or si < 0:
            if self.strict:
                raise ProtocolError(
                    f"Responses {name} requires summary_index for index {item.index}"
                )
            si = max(item.summaries, default=0)
        if name.startswith("response.reasoning_summary_part."):
            part = payload.get("part")
            if not isinstance(part, dict):
                raise ProtocolError(f"malformed Responses {name}")
            item.summaries[si] = dict(part)
            return
        part = item.summaries.setdefault(si, {"type": "summary_text", "text": ""})
        if name.endswith(".delta"):
            part["text"] = as_str(part.get("text")) + as_str(payload.get("delta"))
        else:
            part["text"] = as_str(payload.get("text"))

    # --- result ---------------------------------------------------------------------

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

    def result(self) -> ResponsesResult:
        """The accumulated response so far (complete once :attr:`done`)."""
        output = [self._final_item(self._items[i]) for i in sorted(self._items)]
        output = [o for o in output if o.get("type") != "item_reference"]
        texts: list[str] = []
        calls: list[ToolCall] = []
        summaries: list[str] = []
        for raw in output:
            kind = raw.get("type")
            if kind == "message":
                for part in raw.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        texts.append(as_str(part.get("text")))
            elif kind in TOOL_ITEM_TYPES:
                args = raw.get("arguments") if kind == "function_call" else raw.get("input")
                calls.append(
                    ToolCall(
                        call_id=as_str(raw.get("call_id")) or as_str(raw.get("id")),
                        name=as_str(raw.get("name")),
                        arguments=as_str(args),
                        item_id=as_str(raw.get("id")),
                    )
                )
            elif kind == "reasoning":
                for part in raw.get("summary") or []:
                    if isinstance(part, dict) and as_str(part.get("text")):
                        summaries.append(as_str(part.get("text")))
        error = self._error
        if error is None and self.error_event is not None:
            inner = self.error_event.get("error")
            error = inner if isinstance(inner, dict) else self.error_event
        return ResponsesResult(
            id=self._id,
            model=self._model,
            status=self._status,
            terminal_event=self._terminal,
            stop_reason=stop_reason_for(self._status, self._incomplete_reason, bool(calls)),
            incomplete_reason=self._incomplete_reason,
            error=error,
            output=output,
            usage=self._usage,
            text="".join(texts),
            tool_calls=calls,
            reasoning_summaries=summaries,
            rate_limits=self.rate_limits.events,
            snapshot=self._snapshot,
        )

    def response_body(self) -> dict[str, Any]:
        """The non-stream ``response`` object a client would have received.

        Starts from the last response object the stream carried (so unknown
        fields survive), with the pinned id and model and the accumulated output,
        which Codex terminals often leave empty.
        """
        res = self.result()
        body = dict(res.snapshot)
        body["id"] = res.id
        body.setdefault("object", "response")
        body.setdefault("created_at", 0)
        body["model"] = res.model
        body["status"] = res.status or "in_progress"
        body["output"] = res.output
        if res.usage is not None and body.get("usage") is None:
            body["usage"] = usage_to_responses(res.usage)
        body.setdefault("usage", None)
        body.setdefault("error", res.error)
        body.setdefault("incomplete_details", None)
        return body
