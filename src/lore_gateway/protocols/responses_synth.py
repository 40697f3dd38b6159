"""Synthesise a Responses event stream from a complete response object.

Used when a streaming client must be served from a response the gateway
holds whole (a buffered recall round, or a Codex answer we accumulated). The
output is the full lifecycle the public API streams (lore-spec D.7), so strict
consumers (the openai SDK's ``responses.stream()`` helper, Codex) accept it:
``response.created``, ``response.in_progress``, every item's events, then the
terminal matching the status, with contiguous ``sequence_number`` values.
"""

from __future__ import annotations

import json
from typing import Any

from lore_gateway.sse import encode_event

_TERMINAL_BY_STATUS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}


class _Writer:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._seq = 0

    def emit(self, name: str, fields: dict[str, Any]) -> None:
        payload = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        self.frames.append(encode_event(name, json.dumps(payload, ensure_ascii=False)))


def stream_from_response(response: dict[str, Any]) -> list[bytes]:
    """The SSE frames that stream ``response`` (a Responses ``response`` object)."""
    out = _Writer()
    output = [i for i in response.get("output") or [] if isinstance(i, dict)]
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    opening["error"] = None
    opening["incomplete_details"] = None
    out.emit("response.created", {"response": opening})
    out.emit("response.in_progress", {"response": opening})
    for index, item in enumerate(output):
        _emit_item(out, index, item)
    status = response.get("status") or "completed"
    out.emit(_TERMINAL_BY_STATUS.get(status, "response.completed"), {"response": response})
    return out.frames


def _emit_item(out: _Writer, index: int, item: dict[str, Any]) -> None:
    kind = item.get("type")
    item_id = item.get("id", "")
    loc = {"item_id": item_id, "output_index": index}
    if kind == "message":
        parts = [p for p in item.get("content") or [] if isinstance(p, dict)]
        added = {**item, "status": "in_progress", "content": []}
        out.emit("response.output_item.added", {"output_index": index, "item": added})
        for ci, part in enumerate(parts):
            _emit_part(out, loc, ci, part)
    elif kind == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        out.emit("response.output_item.added", {"output_index": index, "item": added})
        args = item.get("arguments") or ""
        if args:
            out.emit("response.function_call_arguments.delta", {**loc, "delta": args})
        out.emit("response.function_call_arguments.done", {**loc, "arguments": args})
    elif kind == "reasoning":
        summary = [p for p in item.get("summary") or [] if isinstance(p, dict)]
        added = {**item, "summary": []}
        out.emit("response.output_item.added", {"output_index": index, "item": added})
        for si, part in enumerate(summary):
            text = part.get("text") or ""
            sloc = {**loc, "summary_index": si}
            out.emit(
                "response.reasoning_summary_part.added",
                {**sloc, "part": {"type": "summary_text", "text": ""}},
            )
            if text:
                out.emit("response.reasoning_summary_text.delta", {**sloc, "delta": text})
            out.emit("response.reasoning_summary_text.done", {**sloc, "text": text})
            out.emit("response.reasoning_summary_part.done", {**sloc, "part": part})
    else:
        # Built-in tool items (web_search_call, ...) stream their own progress
        # events, which a buffered response no longer has; added+done suffice.
        out.emit("response.output_item.added", {"output_index": index, "item": item})
    out.emit("response.output_item.done", {"output_index": index, "item": item})


def _emit_part(out: _Writer, loc: dict[str, Any], ci: int, part: dict[str, Any]) -> None:
    ploc = {**loc, "content_index": ci}
    kind = part.get("type")
    if kind == "output_text":
        text = part.get("text") or ""
        empty = {**part, "text": ""}
        out.emit("response.content_part.added", {**ploc, "part": empty})
        if text:
            out.emit("response.output_text.delta", {**ploc, "delta": text, "logprobs": []})
        out.emit("response.output_text.done", {**ploc, "text": text, "logprobs": []})
    elif kind == "refusal":
        refusal = part.get("refusal") or ""
        out.emit("response.content_part.added", {**ploc, "part": {**part, "refusal": ""}})
        if refusal:
            out.emit("response.refusal.delta", {**ploc, "delta": refusal})
        out.emit("response.refusal.done", {**ploc, "refusal": refusal})
    else:
        out.emit("response.content_part.added", {**ploc, "part": part})
    out.emit("response.content_part.done", {**ploc, "part": part})
