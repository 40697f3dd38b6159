"""Anthropic Messages: requests, synthesis and turns (sans-IO).

The stream's accumulator is ``anthropic_stream.AnthropicAccumulator``; this
module streams a whole Message (``stream_from_response``) and reads a turn's
messages out of requests and results.
"""

from __future__ import annotations

import json
from typing import Any

from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator, AnthropicResult
from lore_gateway.protocols.common import Message, content_text
from lore_gateway.sse import encode_event

RECALL_TOOL_NAME = "recall"
# Claude Code prepends these to user messages: dates, CLAUDE.md, reminders.
# They are injected context, not the user's words, so they are not stored.
_INJECTED_PREFIX = "<system-reminder>"


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
