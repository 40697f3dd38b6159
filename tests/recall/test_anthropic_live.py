"""The Anthropic live recall interceptor, driven with plain SSE bytes (no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.live import AnthropicRecallStream
from lore_gateway.sse import SSEDecoder, encode_event

MARKER = (
    '📚 Searching all archives for "deploy"…\n'
    "<!-- lore-recall:0b0f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d -->"
)


def message_start(msg_id: str = "msg_1", input_tokens: int = 10,
                  cache_read: int = 5) -> tuple[str, dict[str, Any]]:
    return "message_start", {
        "type": "message_start",
        "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                      "cache_read_input_tokens": cache_read},
        },
    }


def text_block(index: int, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("content_block_start", {"type": "content_block_start", "index": index,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": index,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def thinking_block(index: int, thinking: str, signature: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("content_block_start", {"type": "content_block_start", "index": index,
                                 "content_block": {"type": "thinking", "thinking": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": index,
                                 "delta": {"type": "thinking_delta", "thinking": thinking}}),
        ("content_block_delta", {"type": "content_block_delta", "index": index,
                                 "delta": {"type": "signature_delta", "signature": signature}}),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def tool_block(index: int, name: str, tool_id: str, args: str) -> list[tuple[str, dict[str, Any]]]:
    half = len(args) // 2
    return [
        ("content_block_start", {"type": "content_block_start", "index": index,
                                 "content_block": {"type": "tool_use", "id": tool_id,
                                                   "name": name, "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": index,
                                 "delta": {"type": "input_json_delta",
                                           "partial_json": args[:half]}}),
        ("content_block_delta", {"type": "content_block_delta", "index": index,
                                 "delta": {"type": "input_json_delta",
                                           "partial_json": args[half:]}}),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def ending(stop_reason: str, output_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                           "usage": {"output_tokens": output_tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]


PING = ("ping", {"type": "ping"})


def to_bytes(frames: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(encode_event(name, json.dumps(body)) for name, body in frames)


def relay(stream: AnthropicRecallStream, frames: list[tuple[str, dict[str, Any]]]) -> bytes:
    """Feed upstream bytes in small chunks, as a socket would deliver them."""
    raw = to_bytes(frames)
    decoder = SSEDecoder()
    out = bytearray()
    for i in range(0, len(raw), 37):
        for event in decoder.feed(raw[i : i + 37]):
            out += stream.feed(event)
    for event in decoder.close():
        out += stream.feed(event)
    stream.round.close()
    return bytes(out)


def client_events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    decoder = SSEDecoder()
    events = decoder.feed(data) + decoder.close()
    return [(e.name, json.loads(e.data)) for e in events if e.has_data]


def envelopes(events: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """Split a client stream into messages; assert each is closed exactly once."""
    out: list[list[tuple[str, dict[str, Any]]]] = []
    open_message = False
    for name, body in events:
        if name == "message_start":
            assert not open_message, "message_start before the previous message_stop"
            open_message = True
            out.append([])
        assert open_message or name == "ping", f"{name} outside a message"
        if out:
            out[-1].append((name, body))
        if name == "message_stop":
            open_message = False
    assert not open_message, "last message never stopped"
    return out


def block_indices(envelope: list[tuple[str, dict[str, Any]]]) -> list[int]:
    return [b["index"] for n, b in envelope if n == "content_block_start"]


def visible_tool_names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [b["content_block"]["name"] for n, b in events
            if n == "content_block_start" and b["content_block"]["type"] == "tool_use"]


def run_recall_turn(principal: list[tuple[str, dict[str, Any]]],
                    continuation: list[tuple[str, dict[str, Any]]]) -> tuple[
                        AnthropicRecallStream, bytes]:
    stream = AnthropicRecallStream()
    out = relay(stream, principal)
    assert stream.round.recalls, "the principal should have called recall"
    out += stream.close_preamble() + stream.marker_message(MARKER)
    stream.begin_continuation()
    out += relay(stream, continuation)
    out += stream.finish()
    return stream, out


CONTINUATION = [message_start("msg_2", input_tokens=30, cache_read=2),
                *text_block(0, "Deploys use fly."),
                *ending("end_turn", 7)]


def test_recall_as_first_block_gives_three_envelopes() -> None:
    principal = [message_start(), PING,
                 *tool_block(0, "recall", "toolu_r1", '{"query": "deploy"}'),
                 *ending("tool_use", 4)]
    stream, out = run_recall_turn(principal, CONTINUATION)
    events = client_events(out)
    preamble, marker, cont = envelopes(events)
    assert "recall" not in visible_tool_names(events)
    assert block_indices(preamble) == []
    assert preamble[0][1]["message"]["id"] == "msg_1"
    assert marker[0][1]["message"]["id"].startswith("lore_marker_")
    assert len(marker[0][1]["message"]["id"]) == len("lore_marker_") + 12
    marker_text = [b["delta"]["text"] for n, b in marker if n == "content_block_delta"]
    assert marker_text == [MARKER]
    assert cont[0][1]["message"]["id"] == "msg_2"
    # the preamble shows no tool call, so it must not claim to stop for one
    assert [b["delta"]["stop_reason"] for n, b in preamble if n == "message_delta"] == ["end_turn"]
    assert [b["delta"]["stop_reason"] for n, b in cont if n == "message_delta"] == ["end_turn"]
    (final_delta,) = [b for n, b in cont if n == "message_delta"]
    assert final_delta["usage"]["input_tokens"] == 40
    assert final_delta["usage"]["output_tokens"] == 11
    assert final_delta["usage"]["cache_read_input_tokens"] == 5 + 2
    assert "cache_creation_input_tokens" not in final_delta["usage"]
    (call,) = stream.rounds[0].recalls
    assert (call.tool_use_id, json.loads(call.arguments), call.position) == (
        "toolu_r1", {"query": "deploy"}, 0)


def test_thinking_text_then_recall_streams_preamble_live_and_keeps_thinking() -> None:
    principal = [message_start(), *thinking_block(0, "hmm", "sig=="),
                 *text_block(1, "Let me check."),
                 *tool_block(2, "recall", "toolu_r1", '{"query": "deploy"}'),
                 *ending("tool_use", 9)]
    stream = AnthropicRecallStream()
    raw = to_bytes(principal)
    decoder = SSEDecoder()
    live = bytearray()
    for event in decoder.feed(raw):
        live += stream.feed(event)
    # before the shell does anything, thinking and text already went out,
    # untouched, and nothing of the recall or the terminal did
    live_events = client_events(bytes(live))
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    thinking = [block[0], block[1], block[1], block[2]]
    assert [n for n, _ in live_events] == ["message_start", *thinking, *block]
    assert bytes(live) == to_bytes(principal[:8])
    content = stream.round.acc.content()
    assert content[0] == {"type": "thinking", "thinking": "hmm", "signature": "sig=="}
    assert content[2] == {"type": "tool_use", "id": "toolu_r1", "name": "recall",
                          "input": {"query": "deploy"}}


def test_recall_between_other_tools_reindexes_without_gaps() -> None:
    principal = [message_start(), *text_block(0, "a"),
                 *tool_block(1, "Read", "toolu_a", '{"path": "x"}'),
                 *tool_block(2, "recall", "toolu_r", '{"query": "deploy"}'),
                 *tool_block(3, "Bash", "toolu_b", '{"cmd": "ls"}'),
                 *ending("tool_use", 9)]
    stream = AnthropicRecallStream()
    out = relay(stream, principal)
    out += stream.inline_marker(MARKER) + stream.close_preamble()
    events = client_events(out)
    (only,) = envelopes(events)
    assert block_indices(only) == [0, 1, 2, 3]
    assert visible_tool_names(events) == ["Read", "Bash"]
    # deltas and stops follow their block's new index
    bash = [b for n, b in events if n != "content_block_start" and b.get("index") == 2
            and n == "content_block_delta"]
    assert "".join(b["delta"]["partial_json"] for b in bash) == '{"cmd": "ls"}'
    # a visible tool is in the message, so the stop reason stays tool_use
    assert [b["delta"]["stop_reason"] for n, b in only if n == "message_delta"] == ["tool_use"]
    assert stream.round.visible_tool_uses == 2


def test_two_chained_recalls_each_get_a_marker_message() -> None:
    principal = [message_start(), *tool_block(0, "recall", "toolu_r1", '{"query": "a"}'),
                 *ending("tool_use", 3)]
    second = [message_start("msg_2"), *text_block(0, "more"),
              *tool_block(1, "recall", "toolu_r2", '{"query": "b"}'), *ending("tool_use", 5)]
    third = [message_start("msg_3"), *text_block(0, "done"), *ending("end_turn", 2)]
    stream = AnthropicRecallStream()
    out = relay(stream, principal) + stream.close_preamble() + stream.marker_message(MARKER)
    stream.begin_continuation()
    out += relay(stream, second)
    assert [c.tool_use_id for c in stream.round.recalls] == ["toolu_r2"]
    out += stream.close_preamble() + stream.marker_message(MARKER)
    stream.begin_continuation()
    out += relay(stream, third) + stream.finish()
    events = client_events(out)
    shapes = envelopes(events)
    assert [e[0][1]["message"]["id"][:12] for e in shapes] == [
        "msg_1", "lore_marker_", "msg_2", "lore_marker_", "msg_3"]
    assert sum(1 for n, _ in events if n == "message_stop") == 5
    assert "recall" not in visible_tool_names(events)
    final = next(b for n, b in shapes[-1] if n == "message_delta")
    assert final["usage"]["output_tokens"] == 10
    assert final["usage"]["input_tokens"] == 30


def test_no_recall_passes_bytes_through_unchanged() -> None:
    principal = [message_start(), PING, *text_block(0, "hi"),
                 *tool_block(1, "Read", "toolu_a", '{"p": 1}'), *ending("tool_use", 3)]
    stream = AnthropicRecallStream()
    assert relay(stream, principal) == to_bytes(principal)
    assert stream.round.recalls == []


def test_real_recorded_stream_passes_through_byte_identical() -> None:
    path = "/work/shared/fixtures/anthropic/sdk__tool_use_response.sse"
    with open(path, "rb") as fh:
        raw = fh.read()
    stream = AnthropicRecallStream()
    decoder = SSEDecoder()
    out = bytearray()
    for event in decoder.feed(raw) + decoder.close():
        out += stream.feed(event)
    assert bytes(out) == raw


def test_malformed_event_json_is_a_protocol_error() -> None:
    stream = AnthropicRecallStream()
    decoder = SSEDecoder()
    (event,) = decoder.feed(b"event: message_start\ndata: {nope\n\n")
    with pytest.raises(ProtocolError, match="malformed JSON in Anthropic event message_start"):
        stream.feed(event)


def test_stream_ending_without_message_stop_is_an_error() -> None:
    stream = AnthropicRecallStream()
    with pytest.raises(ProtocolError, match="ended without message_stop"):
        relay(stream, [message_start(), *text_block(0, "cut")])


def test_retained_state_is_bounded() -> None:
    stream = AnthropicRecallStream(max_state_bytes=2000)
    with pytest.raises(ProtocolError, match="retained state exceeded byte limit"):
        relay(stream, [message_start(), *text_block(0, "x" * 4000), *ending("end_turn", 1)])
