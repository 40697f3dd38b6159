"""``collector.stream_usage`` reads a stream's usage from its usage events
alone; it must give exactly what the whole-stream collector gives."""

from __future__ import annotations

import orjson
import pytest

from lore_gateway.collector import TurnCollector, raw_outputs, stream_usage
from lore_gateway.memory.store.records import RawOutputs, RecallRow
from lore_gateway.protocols.common import Message
from lore_gateway.routing import Protocol
from lore_gateway.testing import fake_streams as fs

TRICKY = 'it said "usage": {"input_tokens": 9} and\nevent: message_start\ndata: {} [DONE]'


def frame(name: str, payload: object) -> bytes:
    return f"event: {name}\ndata: {orjson.dumps(payload).decode()}\n\n".encode()


def anthropic_streams() -> list[bytes]:
    plain = b"".join(fs.anthropic_text("four words of text", "claude-x").frames)
    tricky = b"".join(fs.anthropic_text(TRICKY, "claude-x", deltas=5).frames)
    call = b"".join(fs.anthropic_call("recall", '{"query": "x"}', "claude-x").frames)
    cached = (
        frame("message_start", {"type": "message_start", "message": {
            "id": "m1", "type": "message", "role": "assistant", "model": "c", "content": [],
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 700,
                      "cache_creation_input_tokens": None, "output_tokens": 1}}})
        + frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                  "usage": {"output_tokens": 42, "input_tokens": None}})
        + frame("message_stop", {"type": "message_stop"}))
    no_usage = (
        frame("message_start", {"type": "message_start", "message": {
            "id": "m2", "type": "message", "role": "assistant", "model": "c", "content": []}})
        + frame("message_stop", {"type": "message_stop"}))
    # The gateway's own recall stream to an Anthropic client: several messages.
    return [plain, tricky, call, cached, no_usage, plain + cached, cached + no_usage,
            cached + plain, plain.replace(b"\n", b"\r\n")]


def chat_streams() -> list[bytes]:
    with_usage = b"".join(fs.chat_text("four words of text", "gpt-x", True).frames)
    without = b"".join(fs.chat_text("four words of text", "gpt-x", False).frames)
    tricky = b"".join(fs.chat_text(TRICKY, "gpt-x", True, deltas=5).frames)
    call = b"".join(fs.chat_call("recall", '{"query": "x"}', "gpt-x", True).frames)
    errors = b"".join(fs.chat_error_frames())
    return [with_usage, without, tricky, call, with_usage + errors,
            with_usage.replace(b"\n", b"\r\n")]


def collector_usage(protocol: Protocol, body: bytes) -> object:
    collector = TurnCollector(protocol, max_json_bytes=len(body) + 1)
    collector.feed(body)
    return collector.usage()


@pytest.mark.parametrize("body", anthropic_streams())
def test_anthropic_usage_matches_the_whole_stream_parse(body: bytes) -> None:
    assert stream_usage(Protocol.ANTHROPIC, body) == collector_usage(Protocol.ANTHROPIC, body)


@pytest.mark.parametrize("body", chat_streams())
def test_chat_usage_matches_the_whole_stream_parse(body: bytes) -> None:
    assert stream_usage(Protocol.CHAT, body) == collector_usage(Protocol.CHAT, body)


def test_the_fixtures_carry_usage() -> None:
    assert stream_usage(Protocol.ANTHROPIC, anthropic_streams()[3]) is not None
    assert stream_usage(Protocol.CHAT, chat_streams()[0]) is not None


def test_raw_outputs_are_the_collectors_messages_with_a_markerless_recall_first() -> None:
    body = b"".join(fs.anthropic_text("the answer", "claude-x").frames)
    call = Message("assistant", '[tool_call:recall] {"query": "x"}')
    out = raw_outputs(RawOutputs("anthropic", body, (RecallRow(None, call),)))
    assert [m.text for m in out] == [call.text, "the answer"]
