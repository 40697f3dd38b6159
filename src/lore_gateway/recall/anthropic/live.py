"""Live recall interception for an Anthropic Messages stream (lore-spec C.2), sans-IO.

Upstream SSE events go in; the bytes the client should receive now come out.
Nothing here touches a socket, the memory or the clock: the asyncio shell
(``anthropic_handler``) reads the upstream, runs the recall and the follow-up,
and asks this machine what to write.

Two layers:

* :class:`AnthropicRound` relays one upstream message (the principal or one
  continuation). It hides every ``tool_use`` block named ``recall`` (start,
  deltas and stop), renumbers the blocks after it so the client's indices stay
  contiguous, and, once a recall was seen, holds back ``message_delta`` and
  ``message_stop``: the shell decides later whether the message ends there.
  Every event is also applied to the round's accumulated message (the
  protocol's one ``AnthropicAccumulator``), hidden ones included, because the
  follow-up and the stored turn are built from it.
* :class:`AnthropicRecallStream` splices rounds into what an Anthropic client
  sees: the preamble message, a separate marker message (id
  ``lore_marker_<12 hex>``) and the continuation message, each closed by one
  ``message_stop``. The final ``message_delta`` carries the usage of all rounds.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator, parse_event
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.core.chain import RecallCall
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import SSEEvent, encode_event

# The accumulated message is bounded like the Responses path's retained state
# (lore-spec E.1, 16 MiB): a long extended-thinking answer is a few hundred KB.
DEFAULT_MAX_STATE_BYTES = 16 * 1024 * 1024

# Usage fields that are summed across rounds. Cache fields are summed only when
# some round reported them, so a response without cache fields never grows any
# (lore-spec C.3 "usage merge").
_SUMMED_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


_CUT_SHORT = ("max_tokens", "pause_turn", "model_context_window_exceeded")


def content_usable(stop_reason: Any, content: list[dict[str, Any]]) -> bool:
    """C.1 "usable continuation": some text or a tool call, and not cut short."""
    if stop_reason in _CUT_SHORT:
        return False
    for block in content:
        if block.get("type") == "tool_use":
            return True
        if block.get("type") == "text" and str(block.get("text", "")).strip():
            return True
    return False


def sum_usage(rounds: list[dict[str, Any]]) -> dict[str, int]:
    """Add up the usage of several rounds (disjoint convention: input excludes cache)."""
    total: dict[str, int] = {}
    for usage in rounds:
        for field in _SUMMED_USAGE_FIELDS:
            value = usage.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                total[field] = total.get(field, 0) + value
    return total


class AnthropicRound:
    """Relays one upstream Anthropic message with the recall blocks removed.

    The message itself is the round's :class:`AnthropicAccumulator` (``acc``),
    the same reading of the stream storage makes; the round adds only what the
    client sees of it: hidden blocks, their indices, the held terminal."""

    def __init__(
        self, *, hold_terminal: bool = False, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    ) -> None:
        # A continuation always holds its terminal events: its message_delta is
        # rewritten to carry the usage of every round.
        self._hold_terminal = hold_terminal
        self.acc = AnthropicAccumulator(max_state_bytes=max_state_bytes)
        self._client_index: dict[int, int] = {}
        self._hidden: set[int] = set()
        self.recalls: list[RecallCall] = []
        self.visible_tool_uses = 0
        self.held: list[SSEEvent] = []
        self.after_terminal = 0  # upstream events discarded after message_stop
        self.error: dict[str, Any] | None = None  # the upstream's error event, relayed

    @property
    def recall_seen(self) -> bool:
        return bool(self._hidden)

    @property
    def visible_tools(self) -> int:
        return self.visible_tool_uses

    def usable(self) -> bool:
        """C.1 "usable continuation": some text or a tool call, and not cut short."""
        return content_usable(self.acc.stop_reason, self.acc.content())

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream event; return the bytes the client gets now."""
        if not event.has_data:
            return event.raw  # comments and keepalives pass through
        if self.acc.done or self.error is not None:
            # The first terminal is authoritative (lore-spec D.4): what follows it
            # is discarded, never relayed after a finished message.
            self.after_terminal += 1
            return b""
        name = event.name
        if name == "ping":
            return event.raw
        payload = parse_event(event)
        try:
            self.acc.apply(name, payload, len(event.data))
        except ProtocolError:
            if self.acc.error_event is not payload:
                raise
            self.error = payload  # the upstream's own error ends the client's stream
            return event.raw
        kind = payload.get("type")
        if not self._hidden and not self._hold_terminal and kind != "content_block_start":
            return event.raw  # nothing hidden or held: every index is the client's own
        if kind in ("content_block_delta", "content_block_stop"):
            index = payload["index"]
            if index not in self._hidden:
                return self._reindexed(event, payload, index)
            if kind == "content_block_stop":
                call_id = str(self.acc.block(index).get("id", ""))
                self.recalls.append(RecallCall(call_id, self.acc.input_json(index) or "{}", index))
            return b""
        if kind == "content_block_start":
            return self._block_start(event, payload)
        if kind in ("message_delta", "message_stop"):
            return self._terminal(event)
        return event.raw  # message_start, unknown event types: forwarded untouched

    def can_take(self) -> bool:
        """A block open and nothing hidden: where :meth:`take` may apply."""
        return not self._hidden and self.acc.can_take()

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The deltas at the start of one upstream read, taken by the
        accumulator in one go (``AnthropicAccumulator.take``); with nothing
        hidden, their bytes go to the client as they came."""
        return self.acc.take(data, max_frames) if self.can_take() else (0, 0)

    def close(self) -> None:
        """End of the upstream body: the message must have been stopped."""
        if self.error is None and not self.acc.done:
            raise ProtocolError("upstream Anthropic stream ended without message_stop")

    def _block_start(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        index = payload["index"]
        block = payload["content_block"]
        if block.get("type") == "tool_use":
            if block.get("name") == RECALL_TOOL_NAME:
                self._hidden.add(index)
                return b""
            self.visible_tool_uses += 1
        self._client_index[index] = (
            index - sum(1 for h in self._hidden if h < index) if self._hidden else index)
        return self._reindexed(event, payload, index)

    def _terminal(self, event: SSEEvent) -> bytes:
        if self.recall_seen or self._hold_terminal:
            self.held.append(event)
            return b""
        return event.raw

    def _reindexed(self, event: SSEEvent, payload: dict[str, Any], index: int) -> bytes:
        client_index = self._client_index[index]
        if client_index == index:
            return event.raw
        payload = dict(payload)
        payload["index"] = client_index
        return encode_event(event.name, orjson.dumps(payload))


def _marker_id() -> str:
    return "lore_marker_" + secrets.token_hex(6)


class AnthropicRecallStream:
    """What an Anthropic client sees of a response with hidden recalls."""

    def __init__(self, *, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES) -> None:
        self._max_state_bytes = max_state_bytes
        self.round = AnthropicRound(max_state_bytes=max_state_bytes)
        self.rounds: list[AnthropicRound] = [self.round]
        self.model: str | None = None

    def feed(self, event: SSEEvent) -> bytes:
        out = self.round.feed(event)
        if self.model is None and self.round.acc.started:
            model = self.round.acc.message.get("model")
            self.model = model if isinstance(model, str) else None
        return out

    def total_usage(self) -> dict[str, int]:
        return sum_usage([r.acc.usage for r in self.rounds])

    def close_preamble(self) -> bytes:
        """Release the current round's held terminal events, ending its message.

        The message ends with ``end_turn`` rather than ``tool_use`` when the
        client sees no tool call in it: a client that gets ``tool_use`` with no
        tool block would wait for a tool result that never comes.
        """
        out = bytearray()
        for event in self.round.held:
            payload = parse_event(event)
            delta = payload.get("delta")
            if (
                payload.get("type") == "message_delta"
                and isinstance(delta, dict)
                and delta.get("stop_reason") == "tool_use"
                and self.round.visible_tool_uses == 0
            ):
                payload = {**payload, "delta": {**delta, "stop_reason": "end_turn"}}
                out += encode_event(event.name, orjson.dumps(payload))
            else:
                out += event.raw
        self.round.held = []
        return bytes(out)

    def marker_message(self, marker_text: str) -> bytes:
        """A whole assistant message holding only the marker text."""
        start = {
            "type": "message_start",
            "message": {
                "id": _marker_id(),
                "type": "message",
                "role": "assistant",
                "model": self.model or "unknown",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        }
        frames = [
            ("message_start", start),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}},
            ),
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "text_delta", "text": marker_text}},
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {"type": "message_delta",
                 "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": {"output_tokens": 0}},
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return b"".join(encode_event(name, orjson.dumps(body)) for name, body in frames)

    def inline_marker(self, marker_text: str) -> bytes:
        """The marker as a text block appended to the current (open) message.

        Used when the model also called a visible tool: the message must stay
        one envelope so the client runs its tool, and no follow-up is sent.
        """
        index = max(self.round._client_index.values(), default=-1) + 1
        frames = [
            ("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": index,
                                     "delta": {"type": "text_delta", "text": marker_text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
        return b"".join(encode_event(name, orjson.dumps(body)) for name, body in frames)

    def begin_continuation(self) -> None:
        """Start relaying the next upstream message (a follow-up's stream)."""
        self.round = AnthropicRound(hold_terminal=True, max_state_bytes=self._max_state_bytes)
        self.rounds.append(self.round)

    def finish(self) -> bytes:
        """Release the held terminal events with the usage of every round."""
        out = bytearray()
        total = self.total_usage() if len(self.rounds) > 1 else None
        for event in self.round.held:
            payload = parse_event(event)
            if payload.get("type") == "message_delta" and total is not None:
                usage = payload.get("usage")
                merged = dict(usage) if isinstance(usage, dict) else {}
                merged.update(total)
                out += encode_event(event.name, orjson.dumps({**payload, "usage": merged}))
            else:
                out += event.raw
        self.round.held = []
        return bytes(out)
