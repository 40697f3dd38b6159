"""Recall interception for OpenAI Chat Completions (lore-spec C.4), sans-IO.

A Chat upstream's stream is accumulated strictly, chunk by chunk, while the
parts the client may see are relayed live:

* ``delta.content`` (and reasoning fields) go out as they arrive;
* ``tool_calls`` deltas for ``recall`` are removed from their chunk, and the
  indices of the client's own tool calls are renumbered without gaps;
* once a recall was seen, the finish chunk, the usage chunk and ``[DONE]`` are
  held back: the shell runs the recall and the follow-up, and the client gets
  the marker as ordinary ``delta.content`` in the same single envelope.

Chat clients read ``data:``-only frames (the openai SDK treats a frame with an
``event:`` line as a different protocol), so every frame written here is
``data: <json>`` and a blank line.

The follow-up rule is the client's own stream flag: a streaming client gets a
streamed follow-up, relayed live by :class:`ChatRecallStream`; a non-streaming
client gets a ``stream:false`` follow-up whose JSON goes through
:func:`completion_recalls` and :func:`marker_completion`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Any, Generic, Literal, TypeVar

import msgspec
import orjson

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.live import DEFAULT_MAX_STATE_BYTES
from lore_gateway.recall.core.chain import RecallCall
from lore_gateway.recall.core.reads import leading_frames
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import SSEEvent, frame_block

_DONE = b"data: [DONE]\n\n"
D = TypeVar("D")
# Where the fast path of ``ChatRound.take`` ends at the latest: these keys (JSON
# text cannot fake them) and ``[DONE]``. Its checks of each chunk do not rely on
# it. (Not ``"usage"``: asked for usage, OpenAI sends it, null, in every chunk.)
_NOT_CONTENT = (b'"tool_calls"', b'"error"', b'"finish_reason":"', b"[DONE]")


class _Choice(msgspec.Struct, Generic[D]):
    delta: D
    index: Literal[0] = 0
    finish_reason: None = None


class _Chunk(msgspec.Struct, Generic[D]):
    """A chunk exactly as one of ``ChatRound.take``'s runs takes it, as a type:
    one choice at index 0 whose delta is a ``D``, no finish, no error, not even
    ``null`` (``UnsetType`` admits no value), and a usage of null at most
    (asked for usage, OpenAI gives every chunk but the last ``"usage": null``).
    Anything else fails the decoding, and the run stops before it. (The rest is
    checked, not built; the read is UTF-8, so msgspec accepts exactly what
    orjson does.)"""

    choices: tuple[_Choice[D]]
    usage: msgspec.UnsetType | None = msgspec.UNSET
    error: msgspec.UnsetType = msgspec.UNSET


class _TextDelta(msgspec.Struct):
    """Text, and no tool call (not even ``null``)."""

    content: str | None = None
    tool_calls: msgspec.UnsetType = msgspec.UNSET


class _ArgumentsFunction(msgspec.Struct):
    arguments: str


class _ArgumentsCall(msgspec.Struct):
    index: int
    function: _ArgumentsFunction


class _ArgumentsDelta(msgspec.Struct):
    """More of one tool call's arguments, and no text or role. Whether the call
    is a started, visible one is the round's to check; what else the call's
    entry holds, the frame-by-frame path ignores too once the call started."""

    tool_calls: tuple[_ArgumentsCall]
    content: msgspec.UnsetType | None = msgspec.UNSET
    role: msgspec.UnsetType = msgspec.UNSET


_decode_text_chunk = msgspec.json.Decoder(_Chunk[_TextDelta]).decode
_decode_arguments_chunk = msgspec.json.Decoder(_Chunk[_ArgumentsDelta]).decode
_CALL_INDEX = attrgetter("index")


def _frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def sum_chat_usage(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Add up Chat usage objects; nested ``cached_tokens`` only when reported."""
    total: dict[str, Any] = {}
    cached: int | None = None
    for usage in rounds:
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = (cached or 0) + int(details["cached_tokens"])
    if cached is not None:
        total["prompt_tokens_details"] = {"cached_tokens": cached}
    return total


@dataclass(slots=True)
class _ToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ChatRound:
    """Relays one upstream Chat stream with the recall tool calls removed."""

    def __init__(
        self,
        *,
        hold_terminal: bool = False,
        response_id: str | None = None,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    ) -> None:
        # A continuation holds its finish/usage chunks (the usage is summed over
        # rounds) and takes the principal's id, so the client sees one envelope.
        self._hold_terminal = hold_terminal
        self._response_id = response_id
        self._max_state_bytes = max_state_bytes
        self._state_bytes = 0
        self.id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.content: list[str] = []
        self.role = "assistant"
        self.calls: dict[int, _ToolCall] = {}
        self._hidden: set[int] = set()
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.wire_usage: Any = None  # the last usage that was not null, as sent
        self.held: list[dict[str, Any]] = []
        self.done = False
        self.done_sent = False  # this round forwarded the upstream's [DONE]
        self.after_terminal = 0  # upstream frames discarded after [DONE]

    @property
    def recall_seen(self) -> bool:
        return bool(self._hidden)

    @property
    def recalls(self) -> list[RecallCall]:
        return [
            RecallCall(self.calls[i].id, "".join(self.calls[i].arguments) or "{}", i)
            for i in sorted(self._hidden)
        ]

    @property
    def visible_tool_calls(self) -> int:
        return len(self.calls) - len(self._hidden)

    @property
    def visible_tools(self) -> int:
        return self.visible_tool_calls

    def usable(self) -> bool:
        """C.1 "usable continuation": some text or a tool call."""
        return message_usable(self.message())

    @property
    def text(self) -> str:
        return "".join(self.content)

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream frame; return the bytes the client gets now."""
        if not event.has_data:
            return event.raw  # comments and keepalives pass through
        data = event.data
        # A chunk's JSON starts with '{': only other frames need stripping.
        stripped = data if data[:1] == "{" else data.strip()
        if not stripped:
            return b""
        if self.done:
            # [DONE] is the terminal and the first one is authoritative (lore-spec
            # D.4): a repeated [DONE] or a chunk after it is discarded.
            self.after_terminal += 1
            return b""
        if stripped == "[DONE]":
            self.done = True
            if self.finish_reason is None:
                raise ProtocolError("upstream OpenAI request did not complete")
            if self.recall_seen or self._hold_terminal:
                return b""
            self.done_sent = True
            return _DONE
        self._state_bytes += len(data)
        if self._state_bytes > self._max_state_bytes:
            raise StateLimitExceeded(
                f"Chat retained state exceeded byte limit ({self._max_state_bytes} bytes)")
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProtocolError("malformed JSON in OpenAI chunk") from None
        if not isinstance(chunk, dict):
            raise ProtocolError("OpenAI payload type does not match chat.completion.chunk")
        if "error" in chunk:
            raise ProtocolError("upstream OpenAI stream reported an error")
        return self._apply(event, chunk)

    def can_take(self) -> bool:
        """A principal after its first chunk: where :meth:`take` may apply."""
        return (not self.done and self._response_id is None and self.created is not None
                and bool(self.model) and bool(self.id))

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The content chunks at the start of one upstream read (or, once a
        visible tool call has started, the chunks that carry more of its
        arguments), applied as :meth:`feed` applies each, with one look at the
        whole read: how many bytes and frames that was (those bytes go to the
        client as they came). Stops before a frame the fast path would not
        take: a tool call, an error or a finish (found by their keys, which JSON
        text cannot fake), ``[DONE]``, or a chunk of another shape (a usage that
        is not null, say); the caller decodes the rest."""
        if not self.can_take():
            return 0, 0
        # The text run ends at the first tool call or at the (last) finish, found
        # from the end: two short scans where the five triggers took five long ones.
        call = data.find(b'"tool_calls"')
        if call != -1 and self.calls and not self._hidden and call < data.find(b"\n\n"):
            arguments = self._take_arguments(data, max_frames)
            if arguments is not None:
                return arguments
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
        state = self._state_bytes
        for line in frames.lines[:max_frames]:
            if not line.startswith(b"data: {"):
                break
            try:
                chunk = _decode_text_chunk(line[6:])
            except msgspec.DecodeError:
                break
            size = len(line) - 6 if frames.ascii else len(line[6:].decode())
            if state + size > self._max_state_bytes:
                break
            state += size
            content = chunk.choices[0].delta.content
            if content is not None:
                self.content.append(content)
            taken += len(line) + 2
            count += 1
        self._state_bytes = state
        return taken, count

    def _take_block(self, data: bytes, end: int, max_frames: int) -> tuple[int, int] | None:
        """:meth:`take` of every frame before ``end`` as one run; None when
        not every one is a chunk it takes (or the state limit falls among them)."""
        block = frame_block(data, end, b"data: ", max_frames, _decode_text_chunk)
        if block is None or self._state_bytes + block.chars > self._max_state_bytes:
            return None
        self.content.append("".join([c.choices[0].delta.content or "" for c in block.values]))
        self._state_bytes += block.chars
        return block.size, block.frames

    def _take_arguments(self, data: bytes, max_frames: int) -> tuple[int, int] | None:
        """:meth:`take` of a run of chunks that carry more arguments of calls
        already started, up to the finish, while nothing is hidden (then the
        frame-by-frame path appends them and forwards each chunk as it came);
        None when not every frame there is one."""
        finish = data.rfind(b'"finish_reason":"')
        block = frame_block(data, len(data) if finish == -1 else finish, b"data: ", max_frames,
                            _decode_arguments_chunk)
        if block is None or self._state_bytes + block.chars > self._max_state_bytes:
            return None
        pieces = [chunk.choices[0].delta.tool_calls[0] for chunk in block.values]
        if any(piece.index not in self.calls for piece in pieces):
            return None
        for index, run in groupby(pieces, _CALL_INDEX):
            self.calls[index].arguments.append("".join([p.function.arguments for p in run]))
        self._state_bytes += block.chars
        return block.size, block.frames

    def close(self) -> None:
        if self.finish_reason is None:
            raise ProtocolError("upstream OpenAI request did not complete")

    def _apply(self, event: SSEEvent, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if (self._response_id is None and self.created is not None and self.model
                and self.id and type(choices) is list and len(choices) == 1):
            # A principal's content chunk after the first, the common case: what the
            # general path below does with it, without its copies and lookups.
            choice = choices[0]
            delta = choice.get("delta") if type(choice) is dict else None
            if (type(delta) is dict and choice.get("index", 0) == 0
                    and choice.get("finish_reason") is None and "tool_calls" not in delta
                    and chunk.get("usage") is None):
                content = delta.get("content")
                if isinstance(content, str):
                    self.content.append(content)
                return event.raw
        self.id = self.id or _str(chunk.get("id"))
        self.model = self.model or _str(chunk.get("model"))
        created = chunk.get("created")
        if self.created is None and isinstance(created, int):
            self.created = created
        usage = chunk.get("usage")
        if usage is not None:
            self.wire_usage = usage
            if isinstance(usage, dict):
                self.usage = dict(usage)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or len(choices) > 1:
            raise ProtocolError("malformed OpenAI response choice")
        changed = False
        terminal = not choices
        if choices:
            choice = choices[0]
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                raise ProtocolError("malformed OpenAI response choice")
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            if self._response_id is not None and "role" in delta:
                # The client's message already began: the openai SDK concatenates
                # a repeated role ("assistantassistant").
                delta = {k: v for k, v in delta.items() if k != "role"}
                choice = {**choice, "delta": delta}
                chunk = {**chunk, "choices": [choice]}
                changed = True
            if isinstance(delta.get("tool_calls"), list):
                kept = self._tool_deltas(delta["tool_calls"])
                if kept != delta["tool_calls"]:
                    changed = True
                    delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                    if kept:
                        delta["tool_calls"] = kept
                    choice = {**choice, "delta": delta}
                    chunk = {**chunk, "choices": [choice]}
            if choice.get("finish_reason") is not None:
                self.finish_reason = str(choice["finish_reason"])
                terminal = True
            elif changed and not delta:
                return b""  # the chunk only carried recall arguments
        if self._response_id is not None and chunk.get("id") != self._response_id:
            chunk = {**chunk, "id": self._response_id}
            changed = True
        if terminal and (self.recall_seen or self._hold_terminal):
            self.held.append(chunk)
            return b""
        return _frame(chunk) if changed else event.raw

    def _tool_deltas(self, deltas: list[Any]) -> list[Any]:
        kept: list[Any] = []
        for delta in deltas:
            if not isinstance(delta, dict) or not isinstance(delta.get("index"), int):
                raise ProtocolError("malformed OpenAI response tool identity")
            index = delta["index"]
            fn = delta.get("function") or {}
            call = self.calls.get(index)
            if call is None:
                name = fn.get("name")
                if not isinstance(name, str) or not isinstance(delta.get("id"), str):
                    raise ProtocolError("malformed OpenAI response tool identity")
                call = self.calls[index] = _ToolCall(id=delta["id"], name=name)
                if name == RECALL_TOOL_NAME:
                    self._hidden.add(index)
            if isinstance(fn.get("arguments"), str):
                call.arguments.append(fn["arguments"])
            if index in self._hidden:
                continue
            client_index = index - sum(1 for h in self._hidden if h < index)
            kept.append(delta if client_index == index else {**delta, "index": client_index})
        return kept

    def message(self) -> dict[str, Any]:
        """The assistant message as a non-stream completion would carry it."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": "".join(c.arguments)}}
                for _, c in sorted(self.calls.items())
            ]
        return message

    def accumulated(self) -> dict[str, Any]:
        """The whole stream as a non-stream ``chat.completion`` body."""
        body: dict[str, Any] = {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": self.message(),
                         "finish_reason": self.finish_reason}],
        }
        if self.usage:
            body["usage"] = self.usage
        return body


def message_usable(message: dict[str, Any]) -> bool:
    """C.1 "usable continuation": some text or a tool call."""
    return bool(str(message.get("content") or "").strip() or message.get("tool_calls"))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class ChatRecallStream:
    """What a streaming Chat client sees of a response with hidden recalls:
    one envelope, the marker as content, one finish_reason, one ``[DONE]``."""

    def __init__(self, *, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES) -> None:
        self._max_state_bytes = max_state_bytes
        self.round = ChatRound(max_state_bytes=max_state_bytes)
        self.rounds: list[ChatRound] = [self.round]

    def feed(self, event: SSEEvent) -> bytes:
        return self.round.feed(event)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        first = self.rounds[0]
        return {
            "id": first.id, "object": "chat.completion.chunk", "created": first.created,
            "model": first.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def marker_chunk(self, marker_text: str) -> bytes:
        """The marker as ordinary content, set off by blank lines (see
        :func:`marker_content`)."""
        text = marker_content("".join(r.text for r in self.rounds), marker_text)
        return _frame(self._chunk({"content": text}))

    def begin_continuation(self) -> None:
        principal_id = self.rounds[0].id
        self.round = ChatRound(hold_terminal=True, response_id=principal_id,
                               max_state_bytes=self._max_state_bytes)
        self.rounds.append(self.round)

    def finish(self) -> bytes:
        """Release the last round's held chunks with the usage of every round, then
        ``[DONE]``. A finish of ``tool_calls`` with no visible call becomes ``stop``."""
        out = bytearray()
        total = sum_chat_usage([r.usage for r in self.rounds if r.usage])
        for chunk in self.round.held:
            choices = chunk.get("choices") or []
            if choices and choices[0].get("finish_reason") == "tool_calls" \
                    and self.round.visible_tool_calls == 0:
                chunk = {**chunk, "choices": [{**choices[0], "finish_reason": "stop"}]}
            if "usage" in chunk and chunk["usage"] is not None and len(self.rounds) > 1:
                chunk = {**chunk, "usage": {**chunk["usage"], **total}}
            out += _frame(chunk)
        self.round.held = []
        if not self.round.done_sent:
            out += _DONE  # exactly one [DONE]: unless the upstream's already went out
        return bytes(out)


# Blank lines set the marker off from the text around it, so a client that
# renders markdown shows it as its own paragraph and expansion can cut the
# message back into preamble, marker and continuation without guessing.
MARKER_SEPARATOR = "\n\n"


def marker_content(text_before: str, marker_text: str) -> str:
    """The content a Chat client receives for a marker."""
    lead = MARKER_SEPARATOR if text_before else ""
    return lead + marker_text + MARKER_SEPARATOR


# --- non-stream bodies --------------------------------------------------------


def completion_message(body: dict[str, Any]) -> dict[str, Any]:
    """The single assistant message of a ``chat.completion`` body (strict)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ProtocolError("malformed OpenAI response choice")
    message = choices[0].get("message")
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise ProtocolError("malformed OpenAI response choice")
    if choices[0].get("finish_reason") not in ("stop", "tool_calls"):
        raise ProtocolError("upstream OpenAI request did not complete")
    return message


def completion_recalls(body: dict[str, Any]) -> tuple[list[RecallCall], int]:
    """The recall calls of a completion and the number of visible tool calls."""
    message = completion_message(body)
    recalls: list[RecallCall] = []
    visible = 0
    seen: set[str] = set()
    for position, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, dict) else None
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(call_id, str) or call_id in seen:
            raise ProtocolError("malformed OpenAI response tool identity")
        seen.add(call_id)
        if fn.get("name") == RECALL_TOOL_NAME:
            recalls.append(RecallCall(call_id, str(fn.get("arguments") or "{}"), position))
        else:
            visible += 1
    return recalls, visible


def marker_completion(body: dict[str, Any], marker_text: str, prefix: str = "") -> dict[str, Any]:
    """The completion with its recall calls removed and the marker appended to
    the content. ``prefix`` is content already delivered by earlier rounds (the
    client sees it in the same message)."""
    message = completion_message(body)
    calls = [c for c in message.get("tool_calls") or []
             if c["function"].get("name") != RECALL_TOOL_NAME]
    content = str(message.get("content") or "")
    new_message = {**message,
                   "content": prefix + content + marker_content(prefix + content, marker_text)}
    if calls:
        new_message["tool_calls"] = calls
    else:
        new_message.pop("tool_calls", None)
    choice = {**body["choices"][0], "message": new_message,
              "finish_reason": "tool_calls" if calls else "stop"}
    return {**body, "choices": [choice]}


def follow_up_messages(assistant: dict[str, Any], call: RecallCall,
                       result: str) -> list[dict[str, Any]]:
    """The two messages a follow-up appends: the assistant turn holding only the
    recall call (other output replayed as content) and the ``tool`` result."""
    calls = [c for c in assistant.get("tool_calls") or []
             if c.get("id") == call.tool_use_id]
    message = {"role": "assistant", "content": assistant.get("content"), "tool_calls": calls}
    return [message, {"role": "tool", "tool_call_id": call.tool_use_id, "content": result}]
