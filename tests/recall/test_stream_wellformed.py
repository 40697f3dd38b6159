"""Recall-watched streams stay well-formed whatever the upstream does (issue 10 §5).

The first terminal an upstream sends is authoritative (lore-spec D.4): what comes
after it is discarded, never relayed behind a finished answer and never turned
into an error frame after the client already has a success terminal. Limits that
are hit say which limit it was.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from test_anthropic_live import ending, message_start, text_block

from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.live import AnthropicRecallStream
from lore_gateway.recall.chat.live import ChatRecallStream
from lore_gateway.recall.core.chain import stream_failure_message
from lore_gateway.sse import SSEDecoder, encode_event
from lore_gateway.testing import FakeUpstream

TOOLS: Any = [{"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object",
                                        "properties": {"path": {"type": "string"}}}}}]


def anthropic_relay(stream: AnthropicRecallStream, events: list[tuple[str, dict[str, Any]]],
                    raw_tail: bytes = b"") -> bytes:
    raw = b"".join(encode_event(name, json.dumps(body).encode()) for name, body in events)
    out = bytearray()
    for event in SSEDecoder().feed(raw + raw_tail):
        out += stream.feed(event)
    stream.round.close()
    return bytes(out)


def chat_relay(stream: ChatRecallStream, raw: bytes) -> bytes:
    out = bytearray()
    for event in SSEDecoder().feed(raw):
        out += stream.feed(event)
    stream.round.close()
    return bytes(out + stream.finish())


def chat_text(text: str) -> bytes:
    chunks = [
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                      "finish_reason": None}]},
        {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)


# --- Chat: exactly one [DONE] ------------------------------------------------------


async def test_chat_text_answer_with_a_tool_offered_has_exactly_one_done(
        gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    body = {"model": "gpt-x", "stream": True, "tools": TOOLS,
            "messages": [{"role": "user", "content": "hello"}]}
    headers = {"authorization": "Bearer sk-test", "x-lore-session-id": "one-done"}
    async with http.post(gateway.url + "/v1/chat/completions", json=body,
                         headers=headers) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert any(t["function"]["name"] == "recall"
               for t in fake_upstream.model_requests[-1].json["tools"])  # recall-watched
    assert raw.count(b"data: [DONE]") == 1 and raw.endswith(b"data: [DONE]\n\n")


def test_chat_duplicate_done_and_chunks_after_done_are_discarded() -> None:
    stream = ChatRecallStream()
    tail = b'data: [DONE]\n\ndata: [DONE]\n\ndata: {"id":"late","choices":[]}\n\n'
    out = chat_relay(stream, chat_text("hi") + tail)
    assert out.count(b"data: [DONE]") == 1 and out.endswith(b"data: [DONE]\n\n")
    assert b"late" not in out and b"error" not in out
    assert stream.round.after_terminal == 2


def test_chat_stream_without_done_still_gets_one() -> None:
    out = chat_relay(ChatRecallStream(), chat_text("hi"))
    assert out.count(b"data: [DONE]") == 1


# --- Anthropic: the first message_stop is authoritative ------------------------------


def test_anthropic_events_after_message_stop_are_discarded() -> None:
    stream = AnthropicRecallStream()
    late = [*ending("end_turn", 2), *text_block(1, "late text")]
    out = anthropic_relay(stream, [message_start(), *text_block(0, "hi"),
                                   *ending("end_turn", 1), *late])
    assert out.count(b"event: message_stop") == 1
    assert b"late text" not in out and b"event: error" not in out
    assert stream.round.after_terminal == len(late)


def test_anthropic_garbled_event_name_is_a_protocol_error_not_relayed() -> None:
    stream = AnthropicRecallStream()
    garbled = encode_event("content_blok_delta", json.dumps(
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "x"}}).encode())
    with pytest.raises(ProtocolError, match="payload type does not match content_blok_delta"):
        anthropic_relay(stream, [message_start(), *text_block(0, "hi")], garbled)


def test_anthropic_unknown_event_type_is_forwarded_untouched() -> None:
    """Anthropic's versioning policy: clients must tolerate new event types."""
    unknown = encode_event("content_block_note", b'{"type": "content_block_note"}')
    out = anthropic_relay(AnthropicRecallStream(), [message_start()], unknown +
                          b"".join(encode_event(n, json.dumps(b).encode())
                                   for n, b in ending("end_turn", 1)))
    assert unknown in out


# --- limits: linear accumulation, and errors that name the limit ----------------------


def test_anthropic_limit_counts_text_not_framing() -> None:
    """A 16-byte-delta answer carries ~6x its text in SSE framing; the retained
    state is the text, so an answer under the limit is never cut (issue 9 §7)."""
    text = "abcdefghijklmno " * 512  # 8 KiB in 16-byte deltas
    deltas = [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": text[i:i + 16]}})
              for i in range(0, len(text), 16)]
    start, _, stop = text_block(0, "")
    stream = AnthropicRecallStream(max_state_bytes=len(text) + 2048)
    anthropic_relay(stream, [message_start(), start, *deltas, stop, *ending("end_turn", 1)])
    assert stream.round.acc.content()[0]["text"] == text


def test_a_hit_limit_is_named_in_the_client_error() -> None:
    stream = AnthropicRecallStream(max_state_bytes=100)
    with pytest.raises(StateLimitExceeded) as caught:
        anthropic_relay(stream, [message_start(), *text_block(0, "x" * 200)])
    message = stream_failure_message(caught.value)
    assert "retained state exceeded byte limit (100 bytes)" in message
    assert "LORE_RECALL_RETAINED_MAX_BYTES" in message
    assert "after recall" not in message
