"""OpenAI Chat Completions: requests, stream accumulation, synthesis and turns (sans-IO).

The stream is data-only SSE: ``chat.completion.chunk`` objects whose
``choices[i].delta`` carry role, content, refusal and tool-call fragments (by
``tool_calls[j].index``), a chunk with ``finish_reason``, optionally a usage
chunk with empty ``choices``, and ``data: [DONE]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from lore_gateway.protocols.common import Message, ProtocolError, TextBuffer, ToolCall, content_text
from lore_gateway.protocols.usage import Usage, usage_from_chat
from lore_gateway.sse import SSEEvent

RECALL_TOOL_NAME = "recall"
_MAX_CHOICES = 128  # the API caps n at 128
_MAX_TOOL_CALLS = 1_000  # bounds a runaway stream; real turns have a few
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}


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

    def settled_tool_calls(self) -> list[dict[str, Any]]:
        for i, buf in self.args_bufs.items():
            self.tool_calls[i]["function"]["arguments"] = buf.value
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]


class ChatAccumulator:
    """Applies Chat Completions chunks into the complete ``chat.completion``."""

    def __init__(self, *, max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the streamed text kept per choice (storage
        keeps a bounded share of a huge answer); tool arguments are kept whole."""
        self._max_text = max_text_chars
        self._head: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None
        self._done = False
        self.error_event: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        """True once ``data: [DONE]`` arrived."""
        return self._done

    @property
    def finished(self) -> bool:
        """True once every choice seen has a finish_reason (the terminal chunk)."""
        return bool(self._choices) and all(c.finish_reason for c in self._choices.values())

    def feed_event(self, ev: SSEEvent) -> None:
        """Apply one decoded SSE frame."""
        data = ev.data.strip()
        if not ev.has_data or not data:
            return
        if data == "[DONE]":
            self._done = True
            return
        try:
            payload = orjson.loads(data)
        except ValueError:
            raise ProtocolError("malformed JSON in Chat Completions chunk") from None
        if not isinstance(payload, dict):
            raise ProtocolError("malformed Chat Completions chunk")
        self.feed_json(payload)

    def feed_json(self, chunk: dict[str, Any]) -> None:
        if self._done:
            raise ProtocolError("Chat Completions chunk after [DONE]")
        if "error" in chunk and "choices" not in chunk:
            self.error_event = chunk
            raise ProtocolError("Chat Completions stream error event")
        for key in ("id", "object", "created", "model", "system_fingerprint", "service_tier"):
            if key in chunk and key not in self._head:
                self._head[key] = chunk[key]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise ProtocolError("malformed OpenAI response choice")
        for raw in choices:
            self._apply_choice(raw)

    def close(self) -> None:
        """Signal the end of the stream. ``[DONE]`` may be missing (some
        compatible servers omit it) but a finish_reason may not."""
        if not self.finished:
            raise ProtocolError("upstream OpenAI request did not complete")

    def _apply_choice(self, raw: object) -> None:
        if not isinstance(raw, dict):
            raise ProtocolError("malformed OpenAI response choice")
        index = raw.get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < _MAX_CHOICES:
            raise ProtocolError("malformed OpenAI response choice")
        choice = self._choices.get(index)
        if choice is None:  # (not setdefault: that built a _Choice for every chunk)
            choice = self._choices[index] = _Choice()
        delta = raw.get("delta")
        if isinstance(delta, dict):
            if isinstance(delta.get("role"), str):
                choice.role = delta["role"]
            if isinstance(delta.get("content"), str):
                if choice.content_buf is None:
                    choice.content_buf = TextBuffer(limit=self._max_text)
                choice.content_buf.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                if choice.refusal_buf is None:
                    choice.refusal_buf = TextBuffer(limit=self._max_text)
                choice.refusal_buf.append(delta["refusal"])
            for call in delta.get("tool_calls") or []:
                self._apply_tool_call(choice, call)
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice.logprobs if choice.logprobs is not None else {}
            for key, values in logprobs.items():
                if isinstance(values, list):
                    merged.setdefault(key, []).extend(values)
            choice.logprobs = merged
        if raw.get("finish_reason"):
            choice.finish_reason = str(raw["finish_reason"])

    def _apply_tool_call(self, choice: _Choice, call: object) -> None:
        if not isinstance(call, dict):
            raise ProtocolError("malformed OpenAI response tool identity")
        index = call.get("index", len(choice.tool_calls))
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < _MAX_TOOL_CALLS
        ):
            raise ProtocolError("malformed OpenAI response tool identity")
        acc = choice.tool_calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(call.get("id"), str) and call["id"]:
            acc["id"] = call["id"]
        if isinstance(call.get("type"), str):
            acc["type"] = call["type"]
        fn = call.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str) and not acc["function"]["name"]:
                acc["function"]["name"] = fn["name"]
            if isinstance(fn.get("arguments"), str):
                if index not in choice.args_bufs:
                    choice.args_bufs[index] = TextBuffer(str(acc["function"]["arguments"]))
                choice.args_bufs[index].append(fn["arguments"])

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
