"""The data of the Responses accumulator: its result, its items, and the small
pure helpers that read events. Kept apart from the state machine
(``responses_stream``) so each file holds one idea."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from lore_gateway.protocols.common import ProtocolError, TextBuffer, ToolCall
from lore_gateway.protocols.usage import Usage
from lore_gateway.sse import SSEEvent

Mode = Literal["public", "codex"]

# Sparse Codex indices are allocated by us; a real response has a handful of
# items, so 100k (the reference gateway's bound) only stops a runaway stream.
MAX_OUTPUT_INDEX = 100_000

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
INCOMPLETE_REASONS = frozenset({"max_output_tokens", "content_filter"})
LIFECYCLE_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.done"}
)
# The bytes that show a frame is one of them (unescaped quotes: only the event's
# own JSON has them, never a string inside it): the client has the whole answer.
TERMINAL_MARKS = tuple(f'"type":"{kind}"'.encode() for kind in sorted(TERMINAL_EVENTS))
# Which item type a data event belongs to, for locating or creating its item.
KIND_BY_PREFIX = (
    ("response.output_text.", "message"),
    ("response.refusal.", "message"),
    ("response.content_part.", "message"),
    ("response.function_call_arguments.", "function_call"),
    ("response.custom_tool_call_input.", "custom_tool_call"),
    ("response.reasoning_summary_part.", "reasoning"),
    ("response.reasoning_summary_text.", "reasoning"),
    ("response.reasoning_text.", "reasoning"),
)
TOOL_ITEM_TYPES = frozenset({"function_call", "custom_tool_call"})


@dataclass(frozen=True, slots=True)
class ResponsesResult:
    """The accumulated state of one response."""

    id: str
    model: str
    status: str | None  # completed | incomplete | failed | cancelled; None before the terminal
    terminal_event: str | None
    stop_reason: str  # end_turn | tool_use | max_tokens | content_filter | stop
    incomplete_reason: str | None
    error: dict[str, Any] | None
    output: list[dict[str, Any]]  # raw items in output-index order, minus item_reference
    usage: Usage | None
    text: str
    tool_calls: list[ToolCall]
    reasoning_summaries: list[str]
    rate_limits: list[dict[str, Any]]
    snapshot: dict[str, Any] = field(repr=False)  # the latest response object seen


@dataclass(slots=True)
class Item:
    index: int
    type: str
    raw: dict[str, Any]
    id: str = ""
    call_id: str = ""
    name: str = ""
    done: bool = False
    implicit: bool = False
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)
    active_part: int | None = None
    closed_parts: set[int] = field(default_factory=set)
    args: str = ""
    args_streamed: bool = False
    args_done: bool = False
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    matched: bool = False  # used while reconciling a terminal's output
    # Streamed text and arguments, by (content index, field): see TextBuffer.
    texts: dict[tuple[int, str], TextBuffer] = field(default_factory=dict)
    args_buf: TextBuffer | None = None

    def settle(self) -> None:
        """Write the streamed text into ``parts`` and ``args`` before they are read."""
        for (ci, key), buf in self.texts.items():
            part = self.parts.get(ci)
            if part is not None:
                part[key] = buf.value
        if self.args_buf is not None:
            self.args = self.args_buf.value


def item_kind(name: str) -> str | None:
    for prefix, kind in KIND_BY_PREFIX:
        if name.startswith(prefix):
            return kind
    return None


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def as_index(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def decode_payload(ev: SSEEvent, protocol: str) -> dict[str, Any] | None:
    """The JSON object of a data frame, or None for frames with nothing to apply.

    Empty data and ``[DONE]`` are skipped. A non-JSON payload is an error only
    on events of the protocol's own namespace; elsewhere it is left for the relay
    to forward or drop (lore-spec D.1).
    """
    data = ev.data
    if not ev.has_data or not data.strip() or data.strip() == "[DONE]":
        return None
    try:
        payload = orjson.loads(data)
    except ValueError:
        if ev.event is not None and ev.event.startswith("response."):
            raise ProtocolError(f"malformed JSON in {protocol} event {ev.event}") from None
        return None
    if not isinstance(payload, dict):
        raise ProtocolError(f"malformed {protocol} stream event")
    if ev.event is not None and ev.event != "message" and payload.get("type") != ev.event:
        raise ProtocolError(f"{protocol} payload type does not match {ev.event}")
    return payload


def conflicts(known: str, new: object) -> bool:
    return bool(known) and isinstance(new, str) and bool(new) and new != known


def stop_reason_for(status: str | None, reason: str | None, has_tool_call: bool) -> str:
    if status == "incomplete":
        return "content_filter" if reason == "content_filter" else "max_tokens"
    if status in ("failed", "cancelled"):
        return "stop"
    return "tool_use" if has_tool_call else "end_turn"
