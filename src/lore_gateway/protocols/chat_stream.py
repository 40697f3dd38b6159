"""Accumulate an OpenAI Chat Completions stream into the complete
``chat.completion`` (sans-IO).

The stream is data-only SSE: ``chat.completion.chunk`` objects whose
``choices[i].delta`` carry role, content, refusal and tool-call fragments (by
``tool_calls[j].index``), a chunk with ``finish_reason``, optionally a usage
chunk with empty ``choices``, and ``data: [DONE]``. :class:`ChatAccumulator`
is the protocol's one accumulator (``accumulator.StreamAccumulator``): storage
and the live recall round (``recall/chat/live.py``) both drive it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any, Generic, Literal, TypeVar

import msgspec
import orjson

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError, TextBuffer, ToolCall
from lore_gateway.protocols.usage import Usage, usage_from_chat
from lore_gateway.recall.core.reads import leading_frames
from lore_gateway.sse import SSEEvent, frame_block

# The stream's terminal line, at a line start (a JSON string never holds a raw
# newline, so text that quotes it does not match).
TERMINAL_MARKS = (b"\ndata: [DONE]",)
_MAX_CHOICES = 128  # the API caps n at 128
_MAX_TOOL_CALLS = 1_000  # bounds a runaway stream; real turns have a few
_NO_BOUND = sys.maxsize  # no bound on the retained state (storage bounds text instead)
_HEAD_KEYS = frozenset(
    ("id", "object", "created", "model", "system_fingerprint", "service_tier"))
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}


def parse_chunk(data: str) -> dict[str, Any]:
    """A chunk's JSON object, or ``ProtocolError``."""
    try:
        chunk = orjson.loads(data)
    except ValueError:
        raise ProtocolError("malformed JSON in Chat Completions chunk") from None
    if not isinstance(chunk, dict):
        raise ProtocolError("malformed Chat Completions chunk")
    return chunk


# --- the fast paths' types (``ChatAccumulator.take``) --------------------------------
# msgspec decodes a run of frames in C with types that admit exactly what the
# frame-by-frame path would take; anything else fails the decoding, and the run
# is left to the general path. The read is UTF-8, so msgspec accepts exactly
# what orjson does.

D = TypeVar("D")
# Where the fast path of ``take`` ends at the latest: these keys (JSON text
# cannot fake them) and ``[DONE]``. Its checks of each chunk do not rely on it.
# (Not ``"usage"``: asked for usage, OpenAI sends it, null, in every chunk.)
_NOT_CONTENT = (b'"tool_calls"', b'"error"', b'"finish_reason":"', b"[DONE]")


class _FastChoice(msgspec.Struct, Generic[D]):
    delta: D
    index: Literal[0] = 0
    finish_reason: None = None
    logprobs: None = None


class _Chunk(msgspec.Struct, Generic[D]):
    """A chunk exactly as one of ``take``'s runs takes it, as a type: one
    choice at index 0 whose delta is a ``D``, no finish, no logprobs, no error,
    not even ``null`` (``UnsetType`` admits no value), and a usage of null at
    most (asked for usage, OpenAI gives every chunk but the last ``"usage": null``)."""

    choices: tuple[_FastChoice[D]]
    usage: msgspec.UnsetType | None = msgspec.UNSET
    error: msgspec.UnsetType = msgspec.UNSET


class _TextDelta(msgspec.Struct):
    """Text, and no tool call or refusal (not even ``null`` for a tool call); a
    role only as the one a stream keeps."""

    content: str | None = None
    tool_calls: msgspec.UnsetType = msgspec.UNSET
    refusal: msgspec.UnsetType | None = msgspec.UNSET
    role: msgspec.UnsetType | Literal["assistant"] = msgspec.UNSET


class _ArgumentsFunction(msgspec.Struct):
    arguments: str


class _ArgumentsCall(msgspec.Struct):
    index: int
    function: _ArgumentsFunction


class _ArgumentsDelta(msgspec.Struct):
    """More of one tool call's arguments, and no text or role. Whether the call
    started is the accumulator's to check; what else the call's entry holds,
    the frame-by-frame path ignores too once the call started."""

    tool_calls: tuple[_ArgumentsCall]
    content: msgspec.UnsetType | None = msgspec.UNSET
    role: msgspec.UnsetType = msgspec.UNSET


_decode_text_chunk = msgspec.json.Decoder(_Chunk[_TextDelta]).decode
_decode_arguments_chunk = msgspec.json.Decoder(_Chunk[_ArgumentsDelta]).decode
_CALL_INDEX = attrgetter("index")




@dataclass(frozen=True, slots=True)
class ChatResult:
    id: str
    model: str
    finish_reason: str | None
    stop_reason: str  # end_turn | max_tokens | tool_use | content_filter | stop
    text: str
    refusal: str | None
    tool_calls: list[ToolCall]
    usage: Usage | None
    completion: dict[str, Any] = field(repr=False)  # the chat.completion object


@dataclass(slots=True)
class _Choice:
    role: str = "assistant"
    content_buf: TextBuffer | None = None
    refusal_buf: TextBuffer | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    logprobs: dict[str, list[Any]] | None = None
    args_bufs: dict[int, TextBuffer] = field(default_factory=dict)

    @property
    def content(self) -> str | None:
        return self.content_buf.value if self.content_buf is not None else None

    @property
    def refusal(self) -> str | None:
        return self.refusal_buf.value if self.refusal_buf is not None else None

    def text_buffer(self, limit: int | None) -> TextBuffer:
        """The content's buffer, started by the first piece."""
        if self.content_buf is None:
            self.content_buf = TextBuffer(limit=limit)
        return self.content_buf

    def arguments(self, index: int) -> TextBuffer:
        """Tool call ``index``'s arguments buffer, started by the first piece."""
        buf = self.args_bufs.get(index)
        if buf is None:
            arguments = self.tool_calls[index]["function"]["arguments"]
            buf = self.args_bufs[index] = TextBuffer(str(arguments))
        return buf

    def settled_tool_calls(self) -> list[dict[str, Any]]:
        for i, buf in self.args_bufs.items():
            self.tool_calls[i]["function"]["arguments"] = buf.value
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]


class ChatAccumulator:
    """Applies Chat Completions chunks into the complete ``chat.completion``:
    storage's and the live recall round's one reading of the stream
    (``accumulator``).

    The rules are the real API's: a choice's index in range, a tool call's first
    delta with its index, id and name, a finish before ``[DONE]``, nothing after
    it, and no ``error`` in a chunk (its payload kept in ``error_event``)."""

    def __init__(self, *, max_text_chars: int | None = None,
                 max_state_bytes: int | None = None) -> None:
        """``max_text_chars`` bounds the streamed text kept per choice (storage
        keeps a bounded share of a huge answer; tool arguments are kept whole);
        ``max_state_bytes`` bounds the chunks retained at all, raising
        ``StateLimitExceeded`` past it (the live round acts on what it keeps)."""
        self._max_text = max_text_chars
        self._bound = max_state_bytes if max_state_bytes is not None else _NO_BOUND
        self.state_bytes = 0  # the chunks' text, not their SSE framing
        self._head: dict[str, Any] = {}
        self._keys: set[str] = set()  # every top-level key seen (the head's and others)
        # The head holds an int ``created``, a ``model`` and an ``id``: kept
        # rather than checked per chunk, as the head never changes once set.
        self._headed = False
        self._choices: dict[int, _Choice] = {}
        self._text0: TextBuffer | None = None  # the first choice's, once started
        self._usage: Any = None  # the last usage that was not null, as sent
        self._done = False
        self.error_event: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once ``data: [DONE]`` arrived."""
        return self._done

    @property
    def finished(self) -> bool:
        """True once every choice seen has a finish_reason (the terminal chunk)."""
        return bool(self._choices) and all(
            c.finish_reason is not None for c in self._choices.values())

    def feed_event(self, ev: SSEEvent) -> None:
        """Apply one decoded SSE frame."""
        data = ev.data.strip()
        if not ev.has_data or not data:
            return
        if data == "[DONE]":
            self.end()
            return
        self.apply(parse_chunk(ev.data), len(ev.data))

    def end(self) -> None:
        """``data: [DONE]``: the stream's terminal, after its finish."""
        if self._done:
            raise ProtocolError("Chat Completions chunk after [DONE]")
        self._done = True
        if not self.finished:
            raise ProtocolError("upstream OpenAI request did not complete")

    def apply(self, chunk: dict[str, Any], size: int = 0) -> bool:
        """Apply one chunk, given as its JSON and its data's size (charged
        against the state bound). True when the chunk was of the first choice
        alone (or of none) and carried no tool call, with a delta that is an
        object or empty: what a one-choice reader (the live round) may relay
        without reading the chunk again."""
        self.state_bytes += size
        if self.state_bytes > self._bound:
            raise StateLimitExceeded(
                f"Chat retained state exceeded byte limit ({self._bound} bytes)")
        if self._done:
            raise ProtocolError("Chat Completions chunk after [DONE]")
        if "error" in chunk:
            self.error_event = chunk
            raise ProtocolError("Chat Completions stream error event")
        choices = chunk.get("choices")
        if self._headed and type(choices) is list and len(choices) == 1:
            # Most of a stream: text of the first choice, nothing else to apply.
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            if (type(delta) is dict and choice.get("index", 0) == 0 and len(delta) == 1
                    and type(delta.get("content")) is str
                    and choice.get("finish_reason") is None and choice.get("logprobs") is None
                    and chunk.get("usage") is None):
                (self._text0 or self._first_text()).append(delta["content"])
                return True
        # The keys not seen yet, in one set operation (after the first chunk,
        # usually none) rather than six lookups a chunk.
        new = chunk.keys() - self._keys
        if new:
            self._keys |= new
            head = self._head
            for key in new & _HEAD_KEYS:
                head[key] = chunk[key]
            self._headed = (isinstance(head.get("created"), int)
                            and bool(head.get("model")) and bool(head.get("id")))
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        if choices is None:
            return True
        if not isinstance(choices, list):
            raise ProtocolError("malformed OpenAI response choice")
        if len(choices) == 1:
            return self._apply_choice(choices[0])
        for raw in choices:
            self._apply_choice(raw)
        return not choices

    def close(self) -> None:
        """Signal the end of the stream. ``[DONE]`` may be missing (some
        compatible servers omit it) but a finish_reason may not."""
        if not self.finished:
            raise ProtocolError("upstream OpenAI request did not complete")

    def _choice(self, index: int) -> _Choice:
        choice = self._choices.get(index)
        if choice is None:  # (not setdefault: that built a _Choice for every chunk)
            choice = self._choices[index] = _Choice()
        return choice

    def _first_text(self) -> TextBuffer:
        """The first choice's content buffer, started if need be, and kept for
        the fast paths (one lookup a stream instead of two calls a delta)."""
        self._text0 = self._choice(0).text_buffer(self._max_text)
        return self._text0

    def _apply_choice(self, raw: object) -> bool:
        """Apply one choice: whether it was the first one with no tool call,
        its delta an object or empty (``apply``)."""
        if not isinstance(raw, dict):
            raise ProtocolError("malformed OpenAI response choice")
        index = raw.get("index", 0)
        if type(index) is not int or not 0 <= index < _MAX_CHOICES:
            raise ProtocolError("malformed OpenAI response choice")
        choice = self._choice(index)
        delta = raw.get("delta")
        plain = index == 0
        if isinstance(delta, dict):
            if isinstance(delta.get("role"), str):
                choice.role = delta["role"]
            if isinstance(delta.get("content"), str):
                choice.text_buffer(self._max_text).append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                if choice.refusal_buf is None:
                    choice.refusal_buf = TextBuffer(limit=self._max_text)
                choice.refusal_buf.append(delta["refusal"])
            calls = delta.get("tool_calls")
            if calls:
                plain = False
                for call in calls:
                    _apply_tool_call(choice, call)
        elif delta:
            plain = False
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice.logprobs if choice.logprobs is not None else {}
            for key, values in logprobs.items():
                if isinstance(values, list):
                    merged.setdefault(key, []).extend(values)
            choice.logprobs = merged
        if raw.get("finish_reason") is not None:
            choice.finish_reason = str(raw["finish_reason"])
        return plain

    # --- raw reads ------------------------------------------------------------------

    def can_take(self) -> bool:
        """After the first chunk, before ``[DONE]``: where :meth:`take` may apply."""
        return self._headed and not self._done

    def take(self, data: bytes, max_frames: int, *, arguments: bool = True) -> tuple[int, int]:
        """The content chunks of the first choice at the start of one raw read
        (or, with ``arguments``, once a tool call has started, the chunks that
        carry more of its arguments), applied as :meth:`apply` applies each,
        with one look at the whole read: how many bytes and frames that was.
        Stops before a frame the fast path would not take: a tool call, an
        error or a finish (found by their keys, which JSON text cannot fake),
        ``[DONE]``, or a chunk of another shape (a usage that is not null, say);
        the caller decodes the rest."""
        if not self.can_take():
            return 0, 0
        first = self._choices.get(0)
        # The text run ends at the first tool call or at the (last) finish, found
        # from the end: two short scans where the five triggers took five long ones.
        call = data.find(b'"tool_calls"')
        if (call != -1 and arguments and first is not None and first.tool_calls
                and call < data.find(b"\n\n")):
            ran = self._take_arguments(first, data, max_frames)
            if ran is not None:
                return ran
        end = len(data) if call == -1 else call
        finish = data.rfind(b'"finish_reason":"', 0, end)
        if finish != -1:
            end = finish
        whole = self._take_block(data, end, max_frames)
        if whole is not None:
            return whole
        frames = leading_frames(data, 2, _NOT_CONTENT, end)
        if frames is None:
            return 0, 0
        taken = count = 0
        state = self.state_bytes
        for line in frames.lines[:max_frames]:
            if not line.startswith(b"data: {"):
                break
            try:
                chunk = _decode_text_chunk(line[6:])
            except msgspec.DecodeError:
                break
            size = len(line) - 6 if frames.ascii else len(line[6:].decode())
            if state + size > self._bound:
                break
            state += size
            content = chunk.choices[0].delta.content
            if content is not None:
                (self._text0 or self._first_text()).append(content)
            taken += len(line) + 2
            count += 1
        self.state_bytes = state
        return taken, count

    def _take_block(self, data: bytes, end: int, max_frames: int) -> tuple[int, int] | None:
        """:meth:`take` of every frame before ``end`` as one run; None when
        not every one is a chunk it takes (or the state bound falls among them)."""
        run = frame_block(data, end, b"data: ", max_frames, _decode_text_chunk)
        if run is None or self.state_bytes + run.chars > self._bound:
            return None
        joined = "".join([c.choices[0].delta.content or "" for c in run.values])
        # A run of null contents starts no text (an empty one does), as apply does.
        if joined or any(c.choices[0].delta.content is not None for c in run.values):
            (self._text0 or self._first_text()).append(joined)
        self.state_bytes += run.chars
        return run.size, run.frames

    def _take_arguments(self, first: _Choice, data: bytes, max_frames: int
                        ) -> tuple[int, int] | None:
        """:meth:`take` of a run of chunks that carry more arguments of calls
        already started, up to the finish; None when not every frame there is one."""
        finish = data.rfind(b'"finish_reason":"')
        run = frame_block(data, len(data) if finish == -1 else finish, b"data: ", max_frames,
                          _decode_arguments_chunk)
        if run is None or self.state_bytes + run.chars > self._bound:
            return None
        pieces = [chunk.choices[0].delta.tool_calls[0] for chunk in run.values]
        if any(piece.index not in first.tool_calls for piece in pieces):
            return None
        for index, same in groupby(pieces, _CALL_INDEX):
            first.arguments(index).append("".join([p.function.arguments for p in same]))
        self.state_bytes += run.chars
        return run.size, run.frames

    # --- read-outs ------------------------------------------------------------------

    def head(self, key: str) -> Any:
        """A top-level field of the stream's chunks, as the first one carrying it had it."""
        return self._head.get(key)

    @property
    def wire_usage(self) -> Any:
        """The last usage that was not null, as sent."""
        return self._usage

    @property
    def usage(self) -> dict[str, Any]:
        return dict(self._usage) if isinstance(self._usage, dict) else {}

    @property
    def finish_reason(self) -> str | None:
        first = self._choices.get(0)
        return first.finish_reason if first is not None else None

    @property
    def text(self) -> str:
        """The first choice's content so far."""
        first = self._choices.get(0)
        return (first.content or "") if first is not None else ""

    def calls(self) -> list[tuple[int, dict[str, Any]]]:
        """The first choice's tool calls so far, by index, arguments written in."""
        first = self._choices.get(0)
        if first is None or not first.tool_calls:
            return []  # (a text answer's: nothing to settle or sort)
        first.settled_tool_calls()
        return sorted(first.tool_calls.items())

    def message(self) -> dict[str, Any]:
        """The first choice's assistant message as a non-stream completion would
        carry it (content None when empty)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        calls = self.calls()
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"],
                              "arguments": c["function"]["arguments"]}}
                for _, c in calls]
        return message

    def result(self) -> ChatResult:
        choices: list[dict[str, Any]] = []
        for index in sorted(self._choices):
            c = self._choices[index]
            message: dict[str, Any] = {"role": c.role, "content": c.content}
            if c.refusal is not None:
                message["refusal"] = c.refusal
            if c.tool_calls:
                message["tool_calls"] = c.settled_tool_calls()
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": c.logprobs,
                    "finish_reason": c.finish_reason,
                }
            )
        completion: dict[str, Any] = {
            "id": self._head.get("id", ""),
            "object": "chat.completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            "choices": choices,
        }
        for key in ("system_fingerprint", "service_tier"):
            if key in self._head:
                completion[key] = self._head[key]
        if self._usage is not None:
            completion["usage"] = self._usage
        first = self._choices.get(0, _Choice())
        calls = [
            ToolCall(
                call_id=str(tc.get("id") or ""),
                name=str(tc["function"]["name"]),
                arguments=str(tc["function"]["arguments"]),
            )
            for tc in first.settled_tool_calls()
        ]
        return ChatResult(
            id=str(completion["id"]),
            model=str(completion["model"]),
            finish_reason=first.finish_reason,
            stop_reason=_STOP_REASONS.get(first.finish_reason or "", "stop"),
            text=first.content or "",
            refusal=first.refusal,
            tool_calls=calls,
            usage=usage_from_chat(self._usage) if self._usage is not None else None,
            completion=completion,
        )

    def response_body(self) -> dict[str, Any]:
        """The ``chat.completion`` object a non-streaming client expects."""
        return self.result().completion


def _apply_tool_call(choice: _Choice, call: object) -> None:
    """One tool-call delta of a choice: a new call named by its first delta, or
    more of its arguments."""
    index = call.get("index") if isinstance(call, dict) else None
    if type(index) is not int or not 0 <= index < _MAX_TOOL_CALLS:
        raise ProtocolError("malformed OpenAI response tool identity")
    assert isinstance(call, dict)
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else {}
    acc = choice.tool_calls.get(index)
    if acc is None:
        # A call's first delta names it: its id and its function's name.
        if not isinstance(call.get("id"), str) or not isinstance(fn.get("name"), str):
            raise ProtocolError("malformed OpenAI response tool identity")
        acc = choice.tool_calls[index] = {
            "id": call["id"], "type": "function",
            "function": {"name": fn["name"], "arguments": ""}}
    elif isinstance(call.get("id"), str) and call["id"]:
        acc["id"] = call["id"]
    if isinstance(call.get("type"), str):
        acc["type"] = call["type"]
    if isinstance(fn.get("arguments"), str):
        choice.arguments(index).append(fn["arguments"])
