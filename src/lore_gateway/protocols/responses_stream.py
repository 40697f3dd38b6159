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

from lore_gateway.protocols.common import ProtocolError, ToolCall
from lore_gateway.protocols.ratelimits import RATE_LIMITS_EVENT, RateLimitLog
from lore_gateway.protocols.responses_items import ResponsesItems
from lore_gateway.protocols.responses_model import (
    INCOMPLETE_REASONS,
    LIFECYCLE_EVENTS,
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
    stop_reason_for,
)
from lore_gateway.protocols.usage import Usage, usage_from_responses, usage_to_responses
from lore_gateway.sse import SSEEvent


class ResponsesAccumulator(ResponsesItems):
    """Applies Responses stream events; see the module docstring for the modes.

    The protocol's ``accumulator.StreamAccumulator``, like the Anthropic and
    Chat ones: storage and the live recall round both drive it. The item state
    (items, data events, snapshots) is :class:`ResponsesItems`; this class adds
    the lifecycle, the terminal and the result."""

    def __init__(self, mode: Mode = "public", *, max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the text kept per content part and per tool
        call's arguments (storage keeps a bounded share of a huge answer); it
        is for the lenient ``codex`` mode only, as strict checks need it all."""
        if max_text_chars is not None and mode == "public":
            raise ValueError("max_text_chars needs mode='codex'")
        super().__init__(mode, max_text_chars)
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
        self.rate_limits = RateLimitLog()
        self.error_event: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once a terminal event was applied."""
        return self._terminal is not None

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

    # --- result ---------------------------------------------------------------------

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
