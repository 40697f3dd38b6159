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

from typing import Any

import orjson

from lore_gateway.protocols.chat_stream import ChatAccumulator, parse_chunk
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.live import DEFAULT_MAX_STATE_BYTES
from lore_gateway.recall.core.chain import RecallCall
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import SSEEvent

_DONE = b"data: [DONE]\n\n"


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


class ChatRound:
    """Relays one upstream Chat stream with the recall tool calls removed.

    The completion itself is the round's :class:`ChatAccumulator` (``acc``),
    the same reading of the stream storage makes; the round adds only what the
    client sees of it: hidden calls, their indices, one envelope's id and role,
    the held terminal."""

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
        # A principal's chunk goes out as it came unless a call is hidden or
        # the chunk carries a tool call (``ChatAccumulator.apply`` says which).
        self._as_sent = response_id is None and not hold_terminal
        self.acc = ChatAccumulator(max_state_bytes=max_state_bytes)
        self._known: set[int] = set()  # tool call indices seen
        self._hidden: set[int] = set()
        self.held: list[dict[str, Any]] = []
        self.done_sent = False  # this round forwarded the upstream's [DONE]
        self.after_terminal = 0  # upstream frames discarded after [DONE]

    @property
    def recall_seen(self) -> bool:
        return bool(self._hidden)

    @property
    def recalls(self) -> list[RecallCall]:
        if not self._hidden:
            return []  # (most rounds: no calls to read out)
        return [RecallCall(call["id"], call["function"]["arguments"] or "{}", index)
                for index, call in self.acc.calls() if index in self._hidden]

    @property
    def visible_tool_calls(self) -> int:
        return len(self._known) - len(self._hidden)

    @property
    def visible_tools(self) -> int:
        return self.visible_tool_calls

    def usable(self) -> bool:
        """C.1 "usable continuation": some text or a tool call."""
        return message_usable(self.acc.message())

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream frame; return the bytes the client gets now."""
        if not event.has_data:
            return event.raw  # comments and keepalives pass through
        data = event.data
        # A chunk's JSON starts with '{': only other frames need stripping.
        stripped = data if data[:1] == "{" else data.strip()
        if not stripped:
            return b""
        if self.acc.done:
            # [DONE] is the terminal and the first one is authoritative (lore-spec
            # D.4): a repeated [DONE] or a chunk after it is discarded.
            self.after_terminal += 1
            return b""
        if stripped == "[DONE]":
            self.acc.end()
            if self.recall_seen or self._hold_terminal:
                return b""
            self.done_sent = True
            return _DONE
        chunk = parse_chunk(data)
        if self.acc.apply(chunk, len(data)) and self._as_sent and not self._hidden:
            return event.raw
        return self._relayed(event, chunk)

    def can_take(self) -> bool:
        """A principal after its first chunk: where :meth:`take` may apply."""
        return self._response_id is None and self.acc.can_take()

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """The chunks at the start of one upstream read, taken by the
        accumulator in one go (``ChatAccumulator.take``); their bytes go to the
        client as they came (a tool call's arguments only while nothing is
        hidden)."""
        if not self.can_take():
            return 0, 0
        return self.acc.take(data, max_frames, arguments=not self._hidden)

    def close(self) -> None:
        if self.acc.finish_reason is None:
            raise ProtocolError("upstream OpenAI request did not complete")

    def _relayed(self, event: SSEEvent, chunk: dict[str, Any]) -> bytes:
        """The chunk as the client gets it: one choice, recall calls removed,
        the others renumbered, the envelope's id; a terminal held back."""
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
        """The tool call deltas the client sees (the accumulator checked them)."""
        kept: list[Any] = []
        for delta in deltas:
            index = delta["index"]
            if index not in self._known:
                self._known.add(index)
                if delta["function"]["name"] == RECALL_TOOL_NAME:
                    self._hidden.add(index)
            if index in self._hidden:
                continue
            client_index = index - sum(1 for h in self._hidden if h < index)
            kept.append(delta if client_index == index else {**delta, "index": client_index})
        return kept


def message_usable(message: dict[str, Any]) -> bool:
    """C.1 "usable continuation": some text or a tool call."""
    return bool(str(message.get("content") or "").strip() or message.get("tool_calls"))


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
        first = self.rounds[0].acc
        return {
            "id": first.head("id"), "object": "chat.completion.chunk",
            "created": first.head("created"), "model": first.head("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    def marker_chunk(self, marker_text: str) -> bytes:
        """The marker as ordinary content, set off by blank lines (see
        :func:`marker_content`)."""
        text = marker_content("".join(r.acc.text for r in self.rounds), marker_text)
        return _frame(self._chunk({"content": text}))

    def begin_continuation(self) -> None:
        principal_id = self.rounds[0].acc.head("id")
        self.round = ChatRound(hold_terminal=True, response_id=principal_id,
                               max_state_bytes=self._max_state_bytes)
        self.rounds.append(self.round)

    def finish(self) -> bytes:
        """Release the last round's held chunks with the usage of every round, then
        ``[DONE]``. A finish of ``tool_calls`` with no visible call becomes ``stop``."""
        out = bytearray()
        usages = [r.acc.usage for r in self.rounds]  # (each read a copy)
        total = sum_chat_usage([usage for usage in usages if usage])
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
