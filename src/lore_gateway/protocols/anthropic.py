"""Anthropic Messages: requests, stream accumulation, synthesis and turns (sans-IO).

The stream is ``message_start``, then per content block ``content_block_start``
/ ``content_block_delta``* / ``content_block_stop``, then ``message_delta``
(stop reason, cumulative usage) and ``message_stop``; ``ping`` may come
anywhere and an ``error`` event ends the stream. Blocks are kept by index:
text, thinking (with its signature), redacted_thinking, tool_use (whose
``input_json_delta`` fragments are joined and parsed at ``content_block_stop``)
and any other block type, carried opaquely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from lore_gateway.protocols.common import Message, ProtocolError, TextBuffer, ToolCall, content_text
from lore_gateway.protocols.usage import Usage, usage_from_anthropic
from lore_gateway.sse import SSEEvent, encode_event

RECALL_TOOL_NAME = "recall"
# Claude Code prepends these to user messages: dates, CLAUDE.md, reminders.
# They are injected context, not the user's words, so they are not stored.
_INJECTED_PREFIX = "<system-reminder>"
_MAX_BLOCKS = 10_000  # a real message has tens of blocks; bounds a runaway stream


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
    """Applies Anthropic stream events into the complete Message."""

    def __init__(self, *, max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the streamed text kept per block (storage keeps
        a bounded share of a huge answer); tool input is always kept whole."""
        self._max_text = max_text_chars
        self._message: dict[str, Any] | None = None
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, _Block] = {}
        self._stopped = False
        self.error_event: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once ``message_stop`` was applied."""
        return self._stopped

    def feed_event(self, ev: SSEEvent) -> None:
        data = ev.data.strip()
        if not ev.has_data or not data or data == "[DONE]":
            return
        name = ev.event or "message"
        try:
            payload = orjson.loads(data)
        except ValueError:
            raise ProtocolError(f"malformed JSON in Anthropic event {name}") from None
        if not isinstance(payload, dict):
            raise ProtocolError(f"malformed Anthropic event {name}")
        if ev.event is not None and payload.get("type") != ev.event:
            raise ProtocolError(f"Anthropic payload type does not match {ev.event}")
        self.feed_json(str(payload.get("type")), payload)

    def feed_json(self, name: str, payload: dict[str, Any]) -> None:
        if name == "ping":
            return
        if name == "error":
            # Kept so the caller can relay or log what upstream said.
            self.error_event = payload
            raise ProtocolError("Anthropic stream error event")
        if self._stopped:
            raise ProtocolError(f"Anthropic event after message_stop: {name}")
        if name == "message_start":
            self._start(payload)
            return
        if self._message is None:
            raise ProtocolError(f"Anthropic event before message_start: {name}")
        if name == "content_block_start":
            self._block_start(payload)
        elif name == "content_block_delta":
            self._block_delta(payload)
        elif name == "content_block_stop":
            block = self._block(payload, name)
            if block.stopped:
                raise ProtocolError(
                    f"duplicate Anthropic content_block_stop for index {payload['index']}"
                )
            block.stopped = True
            self._finish_block(block, payload["index"])
        elif name == "message_delta":
            self._message_delta(payload)
        elif name == "message_stop":
            self._stopped = True

    def close(self) -> None:
        """Signal the end of the stream; it must have ended with message_stop."""
        if not self._stopped:
            raise ProtocolError("Anthropic stream ended before message_stop")

    def _start(self, payload: dict[str, Any]) -> None:
        if self._message is not None:
            raise ProtocolError("duplicate Anthropic message_start")
        message = payload.get("message")
        if not isinstance(message, dict):
            raise ProtocolError("malformed Anthropic message_start")
        self._message = dict(message)
        usage = message.get("usage")
        if isinstance(usage, dict):
            self._usage = dict(usage)

    def _block(self, payload: dict[str, Any], name: str) -> _Block:
        index = payload.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index not in self._blocks:
            raise ProtocolError(f"Anthropic {name} for unknown block index {index}")
        block = self._blocks[index]
        if block.stopped and name != "content_block_stop":
            raise ProtocolError(f"Anthropic {name} after content_block_stop for index {index}")
        return block

    def _block_start(self, payload: dict[str, Any]) -> None:
        index = payload.get("index")
        block = payload.get("content_block")
        if isinstance(index, bool) or not isinstance(index, int) or not isinstance(block, dict):
            raise ProtocolError("malformed Anthropic content_block_start")
        if index in self._blocks:
            raise ProtocolError(f"duplicate Anthropic content block index {index}")
        if len(self._blocks) >= _MAX_BLOCKS:
            raise ProtocolError("Anthropic stream exceeded content block limit")
        self._blocks[index] = _Block(raw=dict(block))

    def _block_delta(self, payload: dict[str, Any]) -> None:
        block = self._block(payload, "content_block_delta")
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise ProtocolError("malformed Anthropic content_block_delta")
        kind = delta.get("type")
        if kind == "text_delta":
            block.add("text", str(delta.get("text") or ""), self._max_text)
        elif kind == "thinking_delta":
            block.add("thinking", str(delta.get("thinking") or ""), self._max_text)
        elif kind == "signature_delta":
            block.add("signature", str(delta.get("signature") or ""), None)
        elif kind == "input_json_delta":
            block.add("partial_json", str(delta.get("partial_json") or ""), None)
        elif kind == "citations_delta":
            block.raw.setdefault("citations", []).append(delta.get("citation"))

    def _finish_block(self, block: _Block, index: int) -> None:
        block.settled()
        if block.raw.get("type") in ("tool_use", "server_tool_use") and block.partial_json:
            try:
                block.raw["input"] = orjson.loads(block.partial_json)
            except ValueError:
                raise ProtocolError(
                    f"malformed Anthropic tool input JSON for index {index}"
                ) from None

    def _message_delta(self, payload: dict[str, Any]) -> None:
        assert self._message is not None
        delta = payload.get("delta")
        if isinstance(delta, dict):
            for key, value in delta.items():
                self._message[key] = value
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # message_delta usage is cumulative: it replaces, never adds.
            self._usage.update({k: v for k, v in usage.items() if v is not None})

    def result(self) -> AnthropicResult:
        message = dict(self._message or {})
        content: list[dict[str, Any]] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            raw = dict(block.settled())
            if raw.get("type") in ("tool_use", "server_tool_use") and not block.stopped:
                # Cut off mid-input (max_tokens): keep the fragment we have.
                raw["input"] = _partial_input(block.partial_json, raw.get("input"))
            content.append(raw)
        usage_wire = dict(self._usage)
        message.update(content=content, usage=usage_wire)
        message.setdefault("type", "message")
        message.setdefault("role", "assistant")
        message.setdefault("stop_sequence", None)
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
        """The Message object a non-streaming client expects."""
        return self.result().message


def _partial_input(partial: str, initial: object) -> object:
    if not partial:
        return initial if initial is not None else {}
    try:
        return orjson.loads(partial)
    except ValueError:
        return {}


def stream_from_response(message: dict[str, Any]) -> list[bytes]:
    """The SSE frames that stream ``message`` (an Anthropic Message object)."""
    frames: list[bytes] = []

    def emit(name: str, fields: dict[str, Any]) -> None:
        frames.append(encode_event(name, json.dumps({"type": name, **fields}, ensure_ascii=False)))

    usage = dict(message.get("usage") or {})
    start_usage = {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}
    opening = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    emit("message_start", {"message": opening})
    for index, block in enumerate(message.get("content") or []):
        if isinstance(block, dict):
            _emit_block(emit, index, block)
    delta: dict[str, Any] = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
    }
    emit("message_delta", {"delta": delta, "usage": usage})
    emit("message_stop", {})
    return frames


def _emit_block(emit: Any, index: int, block: dict[str, Any]) -> None:
    kind = block.get("type")
    if kind == "text":
        emit("content_block_start", {"index": index, "content_block": {**block, "text": ""}})
        if block.get("text"):
            delta = {"type": "text_delta", "text": block["text"]}
            emit("content_block_delta", {"index": index, "delta": delta})
    elif kind == "thinking":
        empty = {**block, "thinking": "", "signature": ""}
        emit("content_block_start", {"index": index, "content_block": empty})
        if block.get("thinking"):
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            emit("content_block_delta", {"index": index, "delta": delta})
        if block.get("signature"):
            delta = {"type": "signature_delta", "signature": block["signature"]}
            emit("content_block_delta", {"index": index, "delta": delta})
    elif kind in ("tool_use", "server_tool_use"):
        emit("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
        partial = json.dumps(block.get("input", {}), ensure_ascii=False)
        delta = {"type": "input_json_delta", "partial_json": partial}
        emit("content_block_delta", {"index": index, "delta": delta})
    else:
        emit("content_block_start", {"index": index, "content_block": block})
    emit("content_block_stop", {"index": index})


def new_input_messages(body: dict[str, Any]) -> list[Message]:
    """The user-side messages after the last assistant message.

    User text blocks become one ``user`` message (``<system-reminder>`` blocks
    dropped, see module constants); each ``tool_result`` becomes a ``tool``
    message ``[tool:<tool_use_id>] <content>``. Mid-conversation ``system``
    messages (Claude Code sends them) are instructions, not turns, and skipped.
    """
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    start = 0
    for pos, message in enumerate(messages):
        if message.get("role") == "assistant":
            start = pos + 1
    out: list[Message] = []
    for message in messages[start:]:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            if content and not content.lstrip().startswith(_INJECTED_PREFIX):
                out.append(Message("user", content))
            continue
        texts: list[str] = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                if not block["text"].lstrip().startswith(_INJECTED_PREFIX):
                    texts.append(block["text"])
            elif block.get("type") == "tool_result":
                result = content_text(block.get("content"))
                out.append(Message("tool", f"[tool:{block.get('tool_use_id', '')}] {result}"))
        if texts:
            out.append(Message("user", "\n".join(texts)))
    return out


def output_messages(acc: AnthropicAccumulator | AnthropicResult) -> list[Message]:
    """The assistant's output in block order: text, tool calls, and thinking as
    ``[reasoning] <text>`` (Claude 4 returns summarised thinking); redacted
    thinking is encrypted and never stored."""
    result = acc.result() if isinstance(acc, AnthropicAccumulator) else acc
    out: list[Message] = []
    for block in result.content:
        if block.get("type") == "text" and block.get("text"):
            out.append(Message("assistant", str(block["text"])))
        elif block.get("type") == "tool_use":
            args = json.dumps(block.get("input", {}), ensure_ascii=False)
            out.append(Message("assistant", f"[tool_call:{block.get('name', '')}] {args}"))
        elif block.get("type") == "thinking" and block.get("thinking"):
            out.append(Message("assistant", f"[reasoning] {block['thinking']}"))
    return out
