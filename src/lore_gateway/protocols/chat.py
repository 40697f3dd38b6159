"""OpenAI Chat Completions: requests, synthesis and turns (sans-IO).

The stream's accumulator is ``chat_stream.ChatAccumulator``; this module
streams a whole ``chat.completion`` (``stream_from_response``) and reads a
turn's messages out of requests and results.
"""

from __future__ import annotations

import json
from typing import Any

from lore_gateway.protocols.chat_stream import ChatAccumulator, ChatResult
from lore_gateway.protocols.common import Message, content_text

RECALL_TOOL_NAME = "recall"


def _data_frame(payload: dict[str, Any] | str) -> bytes:
    """A data-only frame. Chat streams carry no ``event:`` line, and the openai
    SDK treats a named event as something other than a chunk, so
    ``sse.encode_event`` (which always names the event) is not used here."""
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return b"data: " + text.encode("utf-8") + b"\n\n"


def stream_from_response(completion: dict[str, Any]) -> list[bytes]:
    """The SSE frames that stream ``completion`` (a ``chat.completion`` object)."""
    head = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    for key in ("system_fingerprint", "service_tier"):
        if key in completion:
            head[key] = completion[key]
    frames: list[bytes] = []

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        frames.append(_data_frame({**head, "choices": [choice]}))

    for choice in completion.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        chunk(index, {"role": message.get("role", "assistant"), "content": ""})
        if message.get("content"):
            chunk(index, {"content": message["content"]})
        if message.get("refusal"):
            chunk(index, {"refusal": message["refusal"]})
        for pos, call in enumerate(message.get("tool_calls") or []):
            fn = call.get("function") or {}
            delta_call = {
                "index": pos,
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name", ""), "arguments": fn.get("arguments", "")},
            }
            chunk(index, {"tool_calls": [delta_call]})
        chunk(index, {}, choice.get("finish_reason") or "stop")
    if completion.get("usage") is not None:
        frames.append(_data_frame({**head, "choices": [], "usage": completion["usage"]}))
    frames.append(_data_frame("[DONE]"))
    return frames


def new_input_messages(body: dict[str, Any]) -> list[Message]:
    """The user and tool messages after the last assistant message; system and
    developer messages are instructions, not turns, and are skipped."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    start = 0
    for pos, message in enumerate(messages):
        if message.get("role") == "assistant":
            start = pos + 1
    out: list[Message] = []
    for message in messages[start:]:
        role = message.get("role")
        text = content_text(message.get("content"))
        if role == "user" and text:
            out.append(Message("user", text))
        elif role in ("tool", "function"):
            ref = message.get("tool_call_id") or message.get("name") or ""
            out.append(Message("tool", f"[tool:{ref}] {text}"))
    return out


def output_messages(acc: ChatAccumulator | ChatResult) -> list[Message]:
    """The assistant's output of the first choice: text (or refusal), then tool calls."""
    result = acc.result() if isinstance(acc, ChatAccumulator) else acc
    out: list[Message] = []
    if result.text:
        out.append(Message("assistant", result.text))
    elif result.refusal:
        out.append(Message("assistant", result.refusal))
    out.extend(
        Message("assistant", f"[tool_call:{c.name}] {c.arguments}") for c in result.tool_calls
    )
    return out
