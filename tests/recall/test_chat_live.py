"""The Chat Completions recall interceptor, driven with plain SSE bytes (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.chat.live import (
    ChatRecallStream,
    completion_recalls,
    marker_completion,
)
from lore_gateway.sse import SSEDecoder

FIXTURES = Path("/work/shared/fixtures/chat-completions")
MARKER = (
    '📚 Searching all archives for "deploy"…\n'
    "<!-- lore-recall:0b0f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d -->"
)


def chunk(cid: str, delta: dict[str, Any], finish: str | None = None,
          usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": 1,
                            "model": "gpt-x",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def usage_chunk(cid: str, prompt: int, completion: int) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
            "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def tool_call(index: int, call_id: str, name: str, args: str) -> list[dict[str, Any]]:
    return [
        {"index": index, "id": call_id, "type": "function",
         "function": {"name": name, "arguments": ""}},
        {"index": index, "function": {"arguments": args}},
    ]


def to_bytes(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + \
        b"data: [DONE]\n\n"


def relay(stream: ChatRecallStream, raw: bytes) -> bytes:
    decoder = SSEDecoder()
    out = bytearray()
    for i in range(0, len(raw), 41):
        for event in decoder.feed(raw[i : i + 41]):
            out += stream.feed(event)
    for event in decoder.close():
        out += stream.feed(event)
    stream.round.close()
    return bytes(out)


def client_frames(data: bytes) -> list[Any]:
    decoder = SSEDecoder()
    frames = decoder.feed(data) + decoder.close()
    assert all(f.event is None for f in frames), "chat clients must get data-only frames"
    return [f.data if f.data == "[DONE]" else json.loads(f.data) for f in frames if f.has_data]


def test_recorded_stream_without_recall_is_byte_identical() -> None:
    for name in ("tool_call_single.sse", "tool_calls_parallel_two.sse",
                 "text_stream_logprobs_finish_stop_with_usage.sse"):
        raw = (FIXTURES / name).read_bytes()
        stream = ChatRecallStream()
        assert relay(stream, raw) == raw, name


def test_recorded_recall_call_is_hidden_and_terminal_held() -> None:
    raw = (FIXTURES / "tool_call_single.sse").read_bytes().replace(b"get_weather", b"recall")
    stream = ChatRecallStream()
    out = relay(stream, raw)
    frames = client_frames(out)
    assert "[DONE]" not in frames
    for frame in frames:
        for choice in frame["choices"]:
            assert "tool_calls" not in choice["delta"]
            assert choice["finish_reason"] is None
    (call,) = stream.round.recalls
    assert call.tool_use_id == "call_4XzlGBLtUe9dy3GVNV4jhq7h"
    assert json.loads(call.arguments) == {"city": "New York City"}


def run_turn(principal: list[dict[str, Any]], continuation: list[dict[str, Any]]) -> tuple[
        ChatRecallStream, list[Any]]:
    stream = ChatRecallStream()
    out = relay(stream, to_bytes(principal))
    out += stream.marker_chunk(MARKER)
    stream.begin_continuation()
    out += relay(stream, to_bytes(continuation))
    out += stream.finish()
    return stream, client_frames(out)


def test_marker_is_content_in_one_envelope_with_one_finish_and_done() -> None:
    principal = [
        chunk("c1", {"role": "assistant", "content": "Let me look."}),
        chunk("c1", {"tool_calls": tool_call(0, "call_r", "recall", '{"query":"deploy"}')[:1]}),
        chunk("c1", {"tool_calls": tool_call(0, "call_r", "recall", '{"query":"deploy"}')[1:]}),
        chunk("c1", {}, "tool_calls"),
        usage_chunk("c1", 100, 10),
    ]
    continuation = [chunk("c2", {"role": "assistant", "content": ""}),
                    chunk("c2", {"content": "We deploy with fly."}),
                    chunk("c2", {}, "stop"), usage_chunk("c2", 150, 7)]
    _, frames = run_turn(principal, continuation)
    assert frames[-1] == "[DONE]" and frames.count("[DONE]") == 1
    chunks = frames[:-1]
    assert {c["id"] for c in chunks} == {"c1"}
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"]
                if ch["finish_reason"] is not None]
    assert finishes == ["stop"]
    assert not any("tool_calls" in ch["delta"] for c in chunks for ch in c["choices"])
    content = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert content == "Let me look.\n\n" + MARKER + "\n\nWe deploy with fly."
    (usage,) = [c["usage"] for c in chunks if c.get("usage")]
    assert usage == {"prompt_tokens": 250, "completion_tokens": 17, "total_tokens": 267}


def test_recall_between_visible_tools_reindexes_and_keeps_tool_calls_finish() -> None:
    calls = (tool_call(0, "call_a", "Read", '{"p":1}') + tool_call(1, "call_r", "recall", "{}")
             + tool_call(2, "call_b", "Bash", '{"c":"ls"}'))
    principal = [chunk("c1", {"role": "assistant"})] + [
        chunk("c1", {"tool_calls": [d]}) for d in calls] + [chunk("c1", {}, "tool_calls")]
    stream = ChatRecallStream()
    out = relay(stream, to_bytes(principal)) + stream.marker_chunk(MARKER) + stream.finish()
    frames = client_frames(out)
    seen = [(d["index"], d.get("function", {}).get("name")) for f in frames[:-1]
            for ch in f["choices"] for d in ch["delta"].get("tool_calls", [])]
    assert seen == [(0, "Read"), (0, None), (1, "Bash"), (1, None)]
    finishes = [ch["finish_reason"] for f in frames[:-1] for ch in f["choices"]
                if ch["finish_reason"]]
    assert finishes == ["tool_calls"]
    assert stream.round.visible_tool_calls == 2


def test_stream_without_finish_is_an_error() -> None:
    stream = ChatRecallStream()
    raw = b"data: " + json.dumps(chunk("c1", {"content": "x"})).encode() + b"\n\n"
    with pytest.raises(ProtocolError, match="did not complete"):
        relay(stream, raw)


def test_non_stream_completion_marker_replaces_recall_call() -> None:
    body = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-x",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_r", "type": "function",
                     "function": {"name": "recall", "arguments": '{"query":"deploy"}'}}]}}]}
    recalls, visible = completion_recalls(body)
    assert [(r.tool_use_id, r.arguments) for r in recalls] == [("call_r", '{"query":"deploy"}')]
    assert visible == 0
    out = marker_completion(body, MARKER)
    message = out["choices"][0]["message"]
    assert message["content"] == MARKER + "\n\n"
    assert "tool_calls" not in message
    assert out["choices"][0]["finish_reason"] == "stop"
