"""Accumulate an Anthropic Messages stream into the complete Message (sans-IO).

The stream is ``message_start``, then per content block ``content_block_start``
/ ``content_block_delta``* / ``content_block_stop``, then ``message_delta``
(stop reason, cumulative usage) and ``message_stop``; ``ping`` may come
anywhere and an ``error`` event ends the stream. Blocks are kept by index:
text, thinking (with its signature), redacted_thinking, tool_use (whose
``input_json_delta`` fragments are joined and parsed at ``content_block_stop``)
and any other block type, carried opaquely. :class:`AnthropicAccumulator` is
the protocol's one accumulator (``accumulator.StreamAccumulator``): storage and
the live recall round (``recall/anthropic/live.py``) both drive it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any, ClassVar, Literal

import msgspec
import orjson

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError, TextBuffer, ToolCall
from lore_gateway.protocols.usage import Usage, usage_from_anthropic
from lore_gateway.recall.core.reads import leading_frames
from lore_gateway.sse import SSEEvent, frame_block

# The bytes that show a frame is the stream's terminal, ``message_stop``
# (unescaped quotes: only the event's own JSON has them).
TERMINAL_MARKS = (b'"type":"message_stop"',)
_MAX_BLOCKS = 10_000  # a real message has tens of blocks; bounds a runaway stream
_NO_BOUND = sys.maxsize  # no bound on the retained state (storage bounds text instead)
# The delta types that append to a block, and the field each appends to.
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "signature_delta": "signature",
    "input_json_delta": "partial_json",
}
_BOUNDED_FIELDS = ("text", "thinking")  # the fields ``max_text_chars`` bounds
_TOOL_BLOCKS = ("tool_use", "server_tool_use")


def parse_event(event: SSEEvent) -> dict[str, Any]:
    """An event's JSON object payload, or ``ProtocolError``."""
    try:
        payload = orjson.loads(event.data)
    except ValueError:
        raise ProtocolError(f"malformed JSON in Anthropic event {event.name}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"Anthropic payload type does not match {event.name}")
    return payload


# --- the fast paths' types (``AnthropicAccumulator.take``) -------------------------
# msgspec decodes a run of frames in C with types that admit exactly what the
# frame-by-frame path would take; anything else fails the decoding, and the run
# is left to the general path. The read is UTF-8, so msgspec accepts exactly
# what orjson does.


class _TextDelta(msgspec.Struct):
    type: Literal["text_delta"]
    text: str


class _TextBlockDelta(msgspec.Struct):
    """A ``content_block_delta`` carrying a text delta (its block must also be open)."""

    type: Literal["content_block_delta"]
    index: int
    delta: _TextDelta


_decode_delta = msgspec.json.Decoder(_TextBlockDelta).decode


# The deltas a run of one block is taken in one go of, each with its text as
# ``value`` and the block field the text goes to.
class _RunText(msgspec.Struct, tag="text_delta", tag_field="type"):
    value: str = msgspec.field(name="text")
    field: ClassVar[str] = "text"


class _RunThinking(msgspec.Struct, tag="thinking_delta", tag_field="type"):
    value: str = msgspec.field(name="thinking")
    field: ClassVar[str] = "thinking"


class _RunSignature(msgspec.Struct, tag="signature_delta", tag_field="type"):
    value: str = msgspec.field(name="signature")
    field: ClassVar[str] = "signature"


class _RunJSON(msgspec.Struct, tag="input_json_delta", tag_field="type"):
    value: str = msgspec.field(name="partial_json")
    field: ClassVar[str] = "partial_json"


class _RunDelta(msgspec.Struct):
    """A ``content_block_delta`` as a run takes it: text, thinking, its
    signature or a tool's JSON, each a string."""

    type: Literal["content_block_delta"]
    index: int
    delta: _RunText | _RunThinking | _RunSignature | _RunJSON


_decode_run_delta = msgspec.json.Decoder(_RunDelta).decode
_FIELD = attrgetter("field")
# The frames a run of deltas is made of, and where such a run ends at the latest.
_TEXT_FRAME = b"event: content_block_delta\ndata: "
_BLOCK_STOP = b"event: content_block_stop"
_PING = b"event: ping\ndata:"


@dataclass(frozen=True, slots=True)
class AnthropicResult:
    id: str
    model: str
    stop_reason: str | None
    stop_sequence: str | None
    content: list[dict[str, Any]]
    usage: Usage | None
    text: str
    tool_calls: list[ToolCall]
    thinking: str
    message: dict[str, Any] = field(repr=False)  # the Message object as a non-stream reply


@dataclass(slots=True)
class _Block:
    raw: dict[str, Any]
    stopped: bool = False
    # Streamed fields (text, thinking, signature, partial_json): see TextBuffer.
    bufs: dict[str, TextBuffer] = field(default_factory=dict)

    def add(self, key: str, piece: str, limit: int | None) -> None:
        buf = self.bufs.get(key)
        if buf is None:
            initial = "" if key == "partial_json" else str(self.raw.get(key) or "")
            buf = self.bufs[key] = TextBuffer(initial, limit)
        buf.append(piece)

    @property
    def partial_json(self) -> str:
        buf = self.bufs.get("partial_json")
        return buf.value if buf is not None else ""

    def settled(self) -> dict[str, Any]:
        """The block with its streamed fields written in."""
        for key, buf in self.bufs.items():
            if key != "partial_json":
                self.raw[key] = buf.value
        return self.raw


class AnthropicAccumulator:
    """Applies Anthropic stream events into the complete Message: storage's
    and the live recall round's one reading of the stream (``accumulator``).

    The rules are the real API's: ``message_start`` first and once, blocks
    opened before use and stopped once, tool input that parses, nothing after
    ``message_stop``, which may come with a block still open (a ``max_tokens``
    cut keeps its partial tool input, as the recorded SDK streams show)."""

    def __init__(self, *, max_text_chars: int | None = None,
                 max_state_bytes: int | None = None) -> None:
        """``max_text_chars`` bounds the streamed text and thinking kept per block
        (storage keeps a bounded share of a huge answer; tool input is always
        kept whole); ``max_state_bytes`` bounds what is retained at all, raising
        ``StateLimitExceeded`` past it (the live round acts on what it keeps)."""
        self._max_text = max_text_chars
        self._bound = max_state_bytes if max_state_bytes is not None else _NO_BOUND
        self.state_bytes = 0  # what is retained (text, not SSE framing)
        self.message: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}  # as on the wire, message_delta's laid over
        self._blocks: dict[int, _Block] = {}
        self._open: dict[int, _Block] = {}
        self.started = False
        self._stopped = False
        self.error_event: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once ``message_stop`` was applied."""
        return self._stopped

    @property
    def stop_reason(self) -> Any:
        return self.message.get("stop_reason")

    def can_take(self) -> bool:
        """A block open in a started message: where :meth:`take` may apply."""
        return self.started and not self._stopped and bool(self._open)

    def feed_event(self, ev: SSEEvent) -> None:
        data = ev.data.strip()
        if not ev.has_data or not data or data == "[DONE]":
            return
        self.apply(ev.name, parse_event(ev), len(ev.data))

    def apply(self, name: str, payload: dict[str, Any], size: int = 0) -> None:
        """Apply one event, given as its name (``message`` when the frame named
        none), its JSON payload and its data's size (charged against the
        state bound)."""
        kind = payload.get("type")
        if (kind == "content_block_delta" and self.started and not self._stopped
                and name in ("content_block_delta", "message")):
            self._block_delta(payload, size)  # most of a stream
            return
        if kind != name and name != "message":
            raise ProtocolError(f"Anthropic payload type does not match {name}")
        if kind == "ping":
            return
        self._retain(size)
        if kind == "error":
            # Kept so the caller can relay or log what upstream said.
            self.error_event = payload
            raise ProtocolError("Anthropic stream error event")
        if self._stopped:
            raise ProtocolError(f"Anthropic event after message_stop: {kind}")
        if kind == "message_start":
            self._start(payload)
            return
        if not self.started:
            raise ProtocolError(f"Anthropic event before message_start: {kind}")
        if kind == "content_block_start":
            self._block_start(payload)
        elif kind == "content_block_delta":
            self._block_delta(payload, size)
        elif kind == "content_block_stop":
            self._block_stop(payload)
        elif kind == "message_delta":
            self._message_delta(payload)
        elif kind == "message_stop":
            self._stopped = True

    def close(self) -> None:
        """Signal the end of the stream; it must have ended with message_stop."""
        if not self._stopped:
            raise ProtocolError("Anthropic stream ended before message_stop")

    def _retain(self, size: int) -> None:
        self.state_bytes += size
        if self.state_bytes > self._bound:
            raise StateLimitExceeded(
                f"Anthropic retained state exceeded byte limit ({self._bound} bytes)")

    def _start(self, payload: dict[str, Any]) -> None:
        if self.started:
            raise ProtocolError("duplicate Anthropic message_start")
        message = payload.get("message")
        if not isinstance(message, dict):
            raise ProtocolError("malformed Anthropic message_start")
        self.started = True
        self.message = dict(message)
        usage = message.get("usage")
        if isinstance(usage, dict):
            self.usage = dict(usage)

    def _block(self, payload: dict[str, Any], name: str) -> _Block:
        index = payload.get("index")
        block = self._blocks.get(index) if type(index) is int else None
        if block is None:
            raise ProtocolError(f"Anthropic {name} for unknown block index {index}")
        if block.stopped and name != "content_block_stop":
            raise ProtocolError(f"Anthropic {name} after content_block_stop for index {index}")
        return block

    def _block_start(self, payload: dict[str, Any]) -> None:
        index = payload.get("index")
        block = payload.get("content_block")
        if type(index) is not int or index < 0 or not isinstance(block, dict):
            raise ProtocolError("malformed Anthropic content_block_start")
        if index in self._blocks:
            raise ProtocolError(f"duplicate Anthropic content block index {index}")
        if len(self._blocks) >= _MAX_BLOCKS:
            raise ProtocolError("Anthropic stream exceeded content block limit")
        self._blocks[index] = self._open[index] = _Block(raw=dict(block))

    def _block_delta(self, payload: dict[str, Any], size: int) -> None:
        index = payload.get("index")
        block = (self._open.get(index) if type(index) is int else None) or self._block(
            payload, "content_block_delta")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise ProtocolError("malformed Anthropic content_block_delta")
        kind = delta.get("type")
        key = _DELTA_FIELDS.get(kind) if isinstance(kind, str) else None
        if key is not None:
            piece = delta.get(key) or ""
            if type(piece) is not str:
                piece = str(piece)
            self._retain(len(piece))
            block.add(key, piece, self._max_text if key in _BOUNDED_FIELDS else None)
        elif kind == "citations_delta":
            self._retain(size)
            block.raw.setdefault("citations", []).append(delta.get("citation"))

    def _add(self, block: _Block, key: str, piece: str) -> None:
        """``piece`` appended to the block's field ``key`` (``partial_json``: the
        tool's input JSON, parsed when the block stops)."""
        block.add(key, piece, self._max_text if key in _BOUNDED_FIELDS else None)

    def _block_stop(self, payload: dict[str, Any]) -> None:
        block = self._block(payload, "content_block_stop")
        index = payload["index"]
        if block.stopped:
            raise ProtocolError(f"duplicate Anthropic content_block_stop for index {index}")
        block.stopped = True
        del self._open[index]
        raw = block.settled()
        if raw.get("type") in _TOOL_BLOCKS:
            partial = block.partial_json
            try:
                raw["input"] = orjson.loads(partial) if partial.strip() else raw.get("input", {})
            except ValueError:
                raise ProtocolError(
                    f"malformed Anthropic tool input JSON for index {index}") from None

    def _message_delta(self, payload: dict[str, Any]) -> None:
        delta = payload.get("delta")
        if isinstance(delta, dict):
            for key, value in delta.items():
                self.message[key] = value
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # message_delta usage is cumulative: it replaces, never adds.
            self.usage.update({k: v for k, v in usage.items() if v is not None})

    # --- raw reads ------------------------------------------------------------------

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The deltas of open blocks (and pings) at the start of one raw read,
        applied as :meth:`apply` applies each, with one look at the whole read:
        how many bytes and frames that was. Stops before any other frame, and
        before the state bound; the caller decodes the rest."""
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
        state = self.state_bytes
        for at in range(0, min(len(lines), 2 * max_frames), 2):
            event, line = lines[at], lines[at + 1]
            if event == b"event: ping" and line.startswith(b"data:"):
                taken += len(event) + len(line) + 3  # a ping changes nothing
                count += 1
                continue
            if event != b"event: content_block_delta" or not line.startswith(b"data: {"):
                break
            try:
                delta = _decode_delta(line[6:])
            except msgspec.DecodeError:
                break
            block = self._open.get(delta.index)
            text = delta.delta.text
            if block is None or state + len(text) > self._bound:
                break
            state += len(text)
            self._add(block, "text", text)
            taken += len(event) + len(line) + 3
            count += 1
        self.state_bytes = state
        return taken, count

    def _take_block(self, data: bytes, max_frames: int) -> tuple[int, int] | None:
        """:meth:`take` of the deltas before the first block's end as one run:
        text, thinking and its signature, or a tool's JSON, all of one open
        block; None when not every frame there is one (or the state bound
        falls among them). Pings before them are taken too."""
        pings = start = 0
        while data.startswith(_PING, start):
            end = data.find(b"\n\n", start)
            if end == -1 or data.count(b"\n", start, end) != 1:
                return None
            start = end + 2
            pings += 1
        rest = data[start:] if start else data
        end = rest.find(_BLOCK_STOP)
        run = frame_block(rest, len(rest) if end == -1 else end, _TEXT_FRAME,
                          max_frames - pings, _decode_run_delta)
        if run is None:
            return None
        deltas = run.values
        index = deltas[0].index
        block = self._open.get(index)
        if block is None or any(d.index != index for d in deltas):
            return None
        # One piece a kind of delta (a thinking block's signature follows its thinking).
        pieces = [(key, "".join([d.value for d in same]))
                  for key, same in groupby([d.delta for d in deltas], _FIELD)]
        size = sum(len(text) for _, text in pieces)
        if self.state_bytes + size > self._bound:
            return None
        self.state_bytes += size
        for key, text in pieces:
            self._add(block, key, text)
        return start + run.size, pings + run.frames

    # --- read-outs ------------------------------------------------------------------

    def content(self) -> list[dict[str, Any]]:
        """The content blocks so far in index order, their streamed fields
        written in (the blocks themselves: a follow-up replays them)."""
        return [self._blocks[i].settled() for i in sorted(self._blocks)]

    def block(self, index: int) -> dict[str, Any]:
        """Block ``index`` with its streamed fields written in."""
        return self._blocks[index].settled()

    def input_json(self, index: int) -> str:
        """Block ``index``'s tool input as the model wrote it."""
        return self._blocks[index].partial_json

    def result(self) -> AnthropicResult:
        message = self._message()
        content: list[dict[str, Any]] = message["content"]
        usage_wire: dict[str, Any] = message["usage"]
        calls = [
            ToolCall(
                call_id=str(b.get("id") or ""),
                name=str(b.get("name") or ""),
                arguments=json.dumps(b.get("input", {}), ensure_ascii=False),
                item_id=str(b.get("id") or ""),
            )
            for b in content
            if b.get("type") == "tool_use"
        ]
        return AnthropicResult(
            id=str(message.get("id") or ""),
            model=str(message.get("model") or ""),
            stop_reason=message.get("stop_reason"),
            stop_sequence=message.get("stop_sequence"),
            content=content,
            usage=usage_from_anthropic(usage_wire) if usage_wire else None,
            text="".join(str(b.get("text") or "") for b in content if b.get("type") == "text"),
            tool_calls=calls,
            thinking="".join(
                str(b.get("thinking") or "") for b in content if b.get("type") == "thinking"
            ),
            message=message,
        )

    def response_body(self) -> dict[str, Any]:
        """The Message object a non-streaming client expects: :meth:`result`'s
        ``message`` without the rest of the result. Its usage is checked as
        :meth:`result` checks it, so a malformed one fails here the same way."""
        message = self._message()
        if message["usage"]:
            usage_from_anthropic(message["usage"])
        return message

    def _message(self) -> dict[str, Any]:
        """The Message object so far: its content blocks in index order, their
        streamed fields written in, and the wire usage."""
        message = dict(self.message)
        content: list[dict[str, Any]] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            raw = dict(block.settled())
            if raw.get("type") in _TOOL_BLOCKS and not block.stopped:
                # Cut off mid-input (max_tokens): keep the fragment we have.
                raw["input"] = _partial_input(block.partial_json, raw.get("input"))
            content.append(raw)
        usage_wire = dict(self.usage)
        message.update(content=content, usage=usage_wire)
        message.setdefault("type", "message")
        message.setdefault("role", "assistant")
        message.setdefault("stop_sequence", None)
        return message


def _partial_input(partial: str, initial: object) -> object:
    if not partial:
        return initial if initial is not None else {}
    try:
        return orjson.loads(partial)
    except ValueError:
        return {}
