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
  Every event is also applied to the round's accumulated message, hidden ones
  included, because the follow-up and the stored turn are built from it.
* :class:`AnthropicRecallStream` splices rounds into what an Anthropic client
  sees: the preamble message, a separate marker message (id
  ``lore_marker_<12 hex>``) and the continuation message, each closed by one
  ``message_stop``. The final ``message_delta`` carries the usage of all rounds.
"""

from __future__ import annotations

import secrets
from itertools import groupby
from operator import attrgetter
from typing import Any, ClassVar, Literal

import msgspec
import orjson

from lore_gateway.protocols.common import ProtocolError, TextBuffer
from lore_gateway.recall.core.chain import RecallCall, StateLimitExceeded, event_object
from lore_gateway.recall.core.reads import leading_frames
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import SSEEvent, encode_event, frame_block

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


# The text-like delta types and the block field each one appends to.
_TEXT_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
}


def _loads(event: SSEEvent) -> dict[str, Any]:
    return event_object(event, malformed=f"malformed JSON in Anthropic event {event.name}",
                        not_object=f"Anthropic payload type does not match {event.name}")


class _TextDelta(msgspec.Struct):
    type: Literal["text_delta"]
    text: str


class _TextBlockDelta(msgspec.Struct):
    """A ``content_block_delta`` exactly as ``AnthropicRound.take`` takes it a
    frame at a time, as a type: a text delta (its block must also be open).
    Another kind of delta fails the decoding, and the fast path stops before
    it. (The rest is checked, not built; the read is UTF-8, so msgspec accepts
    exactly what orjson does.)"""

    type: Literal["content_block_delta"]
    index: int
    delta: _TextDelta


_decode_delta = msgspec.json.Decoder(_TextBlockDelta).decode


# The deltas a run of one block is taken in one go of (``AnthropicRound._take_block``),
# each with its text as ``value`` and the block field the text goes to (None: a
# tool's JSON, kept apart until the block stops).
class _RunText(msgspec.Struct, tag="text_delta", tag_field="type"):
    value: str = msgspec.field(name="text")
    field: ClassVar[str | None] = "text"


class _RunThinking(msgspec.Struct, tag="thinking_delta", tag_field="type"):
    value: str = msgspec.field(name="thinking")
    field: ClassVar[str | None] = "thinking"


class _RunSignature(msgspec.Struct, tag="signature_delta", tag_field="type"):
    value: str = msgspec.field(name="signature")
    field: ClassVar[str | None] = "signature"


class _RunJSON(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    value: str = msgspec.field(name="partial_json")
    field: ClassVar[str | None] = None


class _RunDelta(msgspec.Struct):
    """A ``content_block_delta`` as a run takes it: text, thinking, its
    signature or a tool's JSON, each a string (the frame-by-frame path turns
    another value into one; the run leaves such a frame to it)."""

    type: Literal["content_block_delta"]
    index: int
    delta: _RunText | _RunThinking | _RunSignature | _RunJSON


_decode_run_delta = msgspec.json.Decoder(_RunDelta).decode
_FIELD = attrgetter("field")
# The frames a run of deltas is made of, and where such a run ends at the latest.
_TEXT_FRAME = b"event: content_block_delta\ndata: "
_BLOCK_STOP = b"event: content_block_stop"
_PING = b"event: ping\ndata:"


def _index(payload: dict[str, Any], name: str) -> int:
    index = payload.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ProtocolError(f"invalid Anthropic content block index for {name}")
    return index


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
    """Relays one upstream Anthropic message with the recall blocks removed."""

    def __init__(
        self, *, hold_terminal: bool = False, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    ) -> None:
        # A continuation always holds its terminal events: its message_delta is
        # rewritten to carry the usage of every round.
        self._hold_terminal = hold_terminal
        self._max_state_bytes = max_state_bytes
        self._state_bytes = 0
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        # Streamed text per (block, field), in the linear buffer: appending to a
        # str per delta is quadratic on a long answer.
        self._parts: dict[int, dict[str, TextBuffer]] = {}
        # The "text" buffers of ``_parts`` by block, for the text-delta fast path.
        self._text: dict[int, TextBuffer] = {}
        self._partial_json: dict[int, list[str]] = {}
        self._client_index: dict[int, int] = {}
        self._hidden: set[int] = set()
        self._open: set[int] = set()
        self.recalls: list[RecallCall] = []
        self.visible_tool_uses = 0
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.held: list[SSEEvent] = []
        self.started = False
        self.stopped = False
        self.after_terminal = 0  # upstream events discarded after message_stop
        self.error: dict[str, Any] | None = None

    @property
    def recall_seen(self) -> bool:
        return bool(self._hidden)

    @property
    def visible_tools(self) -> int:
        return self.visible_tool_uses

    def usable(self) -> bool:
        """C.1 "usable continuation": some text or a tool call, and not cut short."""
        return content_usable(self.stop_reason, self.content())

    def content(self) -> list[dict[str, Any]]:
        """The accumulated content blocks in upstream order, recall included."""
        for index, fields in self._parts.items():
            block = self.blocks[index]
            for name, buffer in fields.items():
                block[name] = buffer.value
        return [self.blocks[i] for i in sorted(self.blocks)]

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream event; return the bytes the client gets now."""
        if (event.event == "content_block_delta" and event.has_data and self.started
                and not self.stopped):
            # Most of a stream: straight to its handler (the checks below that
            # it would pass, skipped; the payload is still parsed and checked).
            payload = _loads(event)
            if payload.get("type") == "content_block_delta":
                return self._block_delta(event, payload)
            return self._apply(event, "content_block_delta", payload)
        if not event.has_data:
            return event.raw  # comments and keepalives pass through
        if self.stopped:
            # The first terminal is authoritative (lore-spec D.4): what follows it
            # is discarded, never relayed after a finished message.
            self.after_terminal += 1
            return b""
        name = event.name
        if name == "ping":
            return event.raw
        return self._apply(event, name, _loads(event))

    def can_take(self) -> bool:
        """A block open and nothing hidden: where :meth:`take` may apply."""
        return self.started and not self.stopped and not self._hidden and bool(self._open)

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The text deltas at the start of one upstream read, applied as
        :meth:`feed` applies each on its fast path (a visible text block's
        delta while nothing is hidden, and pings), with one look at the whole
        read: how many bytes and frames that was (those bytes go to the client
        as they came). Stops before any other frame; the caller decodes the rest."""
        if not self.can_take():
            return 0, 0
        whole = self._take_block(data, max_frames)
        if whole is not None:
            return whole
        frames = leading_frames(data, 3)
        if frames is None:
            return 0, 0
        lines = frames.lines
        taken = count = 0
        state = self._state_bytes
        for at in range(0, min(len(lines), 2 * max_frames), 2):
            event, line = lines[at], lines[at + 1]
            if event == b"event: ping" and line.startswith(b"data:"):
                taken += len(event) + len(line) + 3  # forwarded unread, as feed does
                count += 1
                continue
            if event != b"event: content_block_delta" or not line.startswith(b"data: {"):
                break
            try:
                delta = _decode_delta(line[6:])
            except msgspec.DecodeError:
                break
            index = delta.index
            if index not in self._open:
                break
            text = delta.delta.text
            if state + len(text) > self._max_state_bytes:
                break
            state += len(text)
            self._buffer(index).append(text)
            taken += len(event) + len(line) + 3
            count += 1
        self._state_bytes = state
        return taken, count

    def _buffer(self, index: int, field: str = "text") -> TextBuffer:
        """Block ``index``'s ``field``, started from the block's own value by
        its first piece."""
        fields = self._parts.setdefault(index, {})
        buffer = fields.get(field)
        if buffer is None:
            buffer = fields[field] = TextBuffer(str(self.blocks[index].get(field, "")))
            if field == "text":
                self._text[index] = buffer
        return buffer

    def _take_block(self, data: bytes, max_frames: int) -> tuple[int, int] | None:
        """:meth:`take` of the deltas before the first block's end as one run:
        text, thinking and its signature, or a visible tool's JSON, all of one
        open block, applied as the frame-by-frame path applies each; None when
        not every frame there is one (or the state limit falls among them).
        Pings before them are taken too."""
        pings = start = 0
        while data.startswith(_PING, start):  # forwarded unread, as feed does
            end = data.find(b"\n\n", start)
            if end == -1 or data.count(b"\n", start, end) != 1:
                return None
            start = end + 2
            pings += 1
        rest = data[start:] if start else data
        end = rest.find(_BLOCK_STOP)
        block = frame_block(rest, len(rest) if end == -1 else end, _TEXT_FRAME,
                            max_frames - pings, _decode_run_delta)
        if block is None:
            return None
        deltas = block.values
        index = deltas[0].index
        if index not in self._open or any(d.index != index for d in deltas):
            return None
        # One piece a kind of delta (a thinking block's signature follows its thinking).
        pieces: list[tuple[str | None, str]] = [
            (field, "".join([d.value for d in run]))
            for field, run in groupby([d.delta for d in deltas], _FIELD)]
        size = sum(len(text) for _, text in pieces)
        if self._state_bytes + size > self._max_state_bytes:
            return None
        self._state_bytes += size
        for field, text in pieces:
            if field is None:
                self._partial_json.setdefault(index, []).append(text)
            else:
                self._buffer(index, field).append(text)
        return start + block.size, pings + block.frames

    def _apply(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> bytes:
        kind = payload.get("type")
        if kind != "content_block_delta":
            self._retain(len(event.data))
        if kind != name and name != "message":
            raise ProtocolError(f"Anthropic payload type does not match {name}")
        if kind == "error":
            self.error = payload
            self.stopped = True
            return event.raw
        if kind == "message_start":
            return self._message_start(event, payload)
        if not self.started:
            raise ProtocolError(f"Anthropic event {kind} before message_start")
        if kind == "content_block_start":
            return self._block_start(event, payload)
        if kind == "content_block_delta":
            return self._block_delta(event, payload)
        if kind == "content_block_stop":
            return self._block_stop(event, payload)
        if kind == "message_delta":
            return self._message_delta(event, payload)
        if kind == "message_stop":
            if self._open:
                raise ProtocolError("Anthropic message_stop with an open content block")
            self.stopped = True
            return self._terminal(event)
        return event.raw  # unknown event types are forwarded untouched

    def _retain(self, size: int) -> None:
        """Charge what the round keeps (text, not SSE framing) against its bound."""
        self._state_bytes += size
        if self._state_bytes > self._max_state_bytes:
            raise StateLimitExceeded(
                f"Anthropic retained state exceeded byte limit ({self._max_state_bytes} bytes)")

    def close(self) -> None:
        """End of the upstream body: the message must have been stopped."""
        if not self.stopped:
            raise ProtocolError("upstream Anthropic stream ended without message_stop")

    def _message_start(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        if self.started:
            raise ProtocolError("duplicate Anthropic message_start")
        message = payload.get("message")
        if not isinstance(message, dict):
            raise ProtocolError("Anthropic payload type does not match message_start")
        self.started = True
        self.message = dict(message)
        usage = message.get("usage")
        self.usage = dict(usage) if isinstance(usage, dict) else {}
        return event.raw

    def _block_start(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        index = _index(payload, "content_block_start")
        block = payload.get("content_block")
        if not isinstance(block, dict) or index in self.blocks:
            raise ProtocolError("invalid Anthropic content_block_start")
        self.blocks[index] = dict(block)
        self._open.add(index)
        if block.get("type") == "tool_use":
            self._partial_json[index] = []
            if block.get("name") == RECALL_TOOL_NAME:
                self._hidden.add(index)
                return b""
            self.visible_tool_uses += 1
        self._client_index[index] = index - sum(1 for h in self._hidden if h < index)
        return self._reindexed(event, payload, index)

    def _block_delta(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        index = _index(payload, "content_block_delta")
        if index not in self._open:
            raise ProtocolError(f"Anthropic content_block_delta for unopened index {index}")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise ProtocolError("Anthropic payload type does not match content_block_delta")
        dtype = delta.get("type")
        if dtype == "text_delta" and index in self._text and not self._hidden:
            # A visible text block's delta, nothing hidden (client index = index):
            # the common case, appended to the block's open buffer.
            text = str(delta.get("text", ""))
            self._state_bytes += len(text)
            if self._state_bytes > self._max_state_bytes:
                self._retain(0)
            self._text[index].append(text)
            return event.raw
        block = self.blocks[index]
        field = _TEXT_DELTA_FIELDS.get(dtype) if isinstance(dtype, str) else None
        if field is not None:
            text = str(delta.get(field, ""))
            self._retain(len(text))
            self._buffer(index, field).append(text)
        elif dtype == "input_json_delta":
            text = str(delta.get("partial_json", ""))
            self._retain(len(text))
            self._partial_json.setdefault(index, []).append(text)
        elif dtype == "citations_delta":
            self._retain(len(event.data))
            block.setdefault("citations", []).append(delta.get("citation"))
        if index in self._hidden:
            return b""
        return self._reindexed(event, payload, index)

    def _block_stop(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        index = _index(payload, "content_block_stop")
        if index not in self._open:
            raise ProtocolError(f"Anthropic content_block_stop for unopened index {index}")
        self._open.discard(index)
        block = self.blocks[index]
        if index in self._partial_json:
            text = "".join(self._partial_json.pop(index))
            try:
                block["input"] = orjson.loads(text) if text.strip() else {}
            except orjson.JSONDecodeError:
                raise ProtocolError(f"malformed tool input JSON for index {index}") from None
            if index in self._hidden:
                self.recalls.append(RecallCall(str(block.get("id", "")), text or "{}", index))
        if index in self._hidden:
            return b""
        return self._reindexed(event, payload, index)

    def _message_delta(self, event: SSEEvent, payload: dict[str, Any]) -> bytes:
        delta = payload.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason") is not None:
            self.stop_reason = str(delta["stop_reason"])
            self.message["stop_reason"] = self.stop_reason
            self.message["stop_sequence"] = delta.get("stop_sequence")
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # message_delta usage is cumulative for the message: it replaces.
            self.usage.update({k: v for k, v in usage.items() if v is not None})
        return self._terminal(event)

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

    def accumulated(self) -> dict[str, Any]:
        """The complete upstream message as a non-stream body would carry it."""
        message = dict(self.message)
        message["content"] = self.content()
        message["usage"] = dict(self.usage)
        return message


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
        if self.model is None and self.round.started:
            model = self.round.message.get("model")
            self.model = model if isinstance(model, str) else None
        return out

    def total_usage(self) -> dict[str, int]:
        return sum_usage([r.usage for r in self.rounds])

    def close_preamble(self) -> bytes:
        """Release the current round's held terminal events, ending its message.

        The message ends with ``end_turn`` rather than ``tool_use`` when the
        client sees no tool call in it: a client that gets ``tool_use`` with no
        tool block would wait for a tool result that never comes.
        """
        out = bytearray()
        for event in self.round.held:
            payload = _loads(event)
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
            payload = _loads(event)
            if payload.get("type") == "message_delta" and total is not None:
                usage = payload.get("usage")
                merged = dict(usage) if isinstance(usage, dict) else {}
                merged.update(total)
                out += encode_event(event.name, orjson.dumps({**payload, "usage": merged}))
            else:
                out += event.raw
        self.round.held = []
        return bytes(out)
