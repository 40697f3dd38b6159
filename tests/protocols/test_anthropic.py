"""Anthropic accumulator on every recorded stream; requests and turn extraction."""

from __future__ import annotations

import json

import pytest

from lore_gateway.protocols.anthropic import (
    new_input_messages,
    output_messages,
)
from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.sse import SSEEvent

from ._fixtures import FIXTURES, body_of, events

AN = FIXTURES / "anthropic"


def accumulate(path_or_events: object) -> AnthropicAccumulator:
    evs = events(path_or_events) if not isinstance(path_or_events, list) else path_or_events  # type: ignore[arg-type]
    acc = AnthropicAccumulator()
    for ev in evs:
        acc.feed_event(ev)
    acc.close()
    return acc


def test_text_stream_matches_nonstream_shape() -> None:
    acc = accumulate(AN / "vercel__anthropic-text.chunks.jsonl")
    body = acc.response_body()
    reference = json.loads((AN / "vercel__anthropic-text.json").read_text())
    assert set(body) == set(reference)
    assert set(body["usage"]) == set(reference["usage"])
    assert body["stop_reason"] == "end_turn" and body["content"][0]["type"] == "text"
    res = acc.result()
    assert res.text and res.usage is not None and res.usage.input_tokens == 12
    assert res.usage.cache_read == 0 and res.usage.cache_write == 0


def test_tool_use_input_json_is_concatenated_and_parsed() -> None:
    res = accumulate(AN / "sdk__tool_use_response.sse").result()
    assert res.stop_reason == "tool_use"
    assert res.text == "I'll check the current weather in Paris for you."
    assert res.content[1]["input"] == {"location": "Paris"}
    assert res.content[1]["caller"] == {"type": "direct"}
    assert res.usage is not None and res.usage.output_tokens == 65
    assert output_messages(res)[-1] == Message(
        "assistant", '[tool_call:get_weather] {"location": "Paris"}'
    )


@pytest.mark.parametrize(
    ("name", "stop", "check"),
    [
        ("sdk__basic_response.sse", "end_turn", lambda r: r.text == "Hello there!"),
        ("sdk__refusal_response.sse", "refusal", lambda r: True),
        ("sdk__incomplete_partial_json_response.sse", "max_tokens", lambda r: r.tool_calls),
        (
            "vercel__anthropic-tool-no-args.chunks.jsonl",
            "tool_use",
            lambda r: r.content[-1]["input"] == {},
        ),
        (
            "vercel__anthropic-json-tool.1.chunks.jsonl",
            "tool_use",
            lambda r: r.tool_calls and not r.text,
        ),
        ("vercel__anthropic-refusal.chunks.jsonl", "refusal", lambda r: r.content == []),
        (
            "vercel__anthropic-message-delta-input-tokens.chunks.jsonl",
            None,
            lambda r: r.usage.input_tokens > 0,
        ),
    ],
)
def test_every_recorded_stream(name: str, stop: str | None, check: object) -> None:
    res = accumulate(AN / name).result()
    if stop is not None:
        assert res.stop_reason == stop
    assert check(res)  # type: ignore[operator]


def test_claude_code_served_streams() -> None:
    text = accumulate(FIXTURES / "claude-code" / "served_text_accepted.sse").result()
    assert text.text and text.stop_reason == "end_turn"
    tool = accumulate(FIXTURES / "claude-code" / "served_tool_use_recall_accepted.sse").result()
    assert [c.name for c in tool.tool_calls] == ["recall"]


def _ev(name: str, payload: object) -> SSEEvent:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return SSEEvent(event=name, data=data, has_data=True, raw=b"")


START = {
    "type": "message_start",
    "message": {"id": "m", "model": "c", "content": [], "usage": {"input_tokens": 1}},
}


def test_error_event_raises_and_keeps_payload() -> None:
    acc = AnthropicAccumulator()
    acc.feed_event(_ev("message_start", START))
    err = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(ProtocolError, match="^Anthropic stream error event$"):
        acc.feed_event(_ev("error", err))
    assert acc.error_event == err


@pytest.mark.parametrize(
    ("evs", "message"),
    [
        (
            [
                _ev(
                    "content_block_start",
                    {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
                )
            ],
            "Anthropic event before message_start: content_block_start",
        ),
        (
            [_ev("message_start", START), _ev("message_start", START)],
            "duplicate Anthropic message_start",
        ),
        ([_ev("message_start", "{oops")], "malformed JSON in Anthropic event message_start"),
        (
            [_ev("message_start", {"type": "ping"})],
            "Anthropic payload type does not match message_start",
        ),
        (
            [
                _ev("message_start", START),
                _ev(
                    "content_block_delta", {"type": "content_block_delta", "index": 3, "delta": {}}
                ),
            ],
            "Anthropic content_block_delta for unknown block index 3",
        ),
        (
            [
                _ev("message_start", START),
                _ev(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}},
                    },
                ),
                _ev(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": "{bad"},
                    },
                ),
                _ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ],
            "malformed Anthropic tool input JSON for index 0",
        ),
        (
            [
                _ev("message_start", START),
                _ev("message_stop", {"type": "message_stop"}),
                _ev("message_stop", {"type": "message_stop"}),
            ],
            "Anthropic event after message_stop: message_stop",
        ),
    ],
)
def test_stream_errors(evs: list[SSEEvent], message: str) -> None:
    acc = AnthropicAccumulator()
    with pytest.raises(ProtocolError) as info:
        for ev in evs:
            acc.feed_event(ev)
    assert str(info.value) == message


def test_end_without_message_stop() -> None:
    acc = AnthropicAccumulator()
    acc.feed_event(_ev("message_start", START))
    with pytest.raises(ProtocolError, match="^Anthropic stream ended before message_stop$"):
        acc.close()


def test_thinking_with_signature_and_redacted_blocks() -> None:
    evs = [
        _ev("message_start", START),
        _ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""},
            },
        ),
        _ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "Let me "},
            },
        ),
        _ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "think."},
            },
        ),
        _ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": "sig=="},
            },
        ),
        _ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "redacted_thinking", "data": "enc"},
            },
        ),
        _ev("content_block_stop", {"type": "content_block_stop", "index": 1}),
        _ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 9},
            },
        ),
        _ev("message_stop", {"type": "message_stop"}),
    ]
    res = accumulate(evs).result()
    assert res.content == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="},
        {"type": "redacted_thinking", "data": "enc"},
    ]
    assert output_messages(res) == [Message("assistant", "[reasoning] Let me think.")]
    assert res.usage is not None and (res.usage.input_tokens, res.usage.output_tokens) == (1, 9)


def test_new_input_on_claude_code_captures() -> None:
    body = body_of("claude-code/captured-requests/messages_turn1_request.json")
    assert new_input_messages(body) == [Message("user", "say hi")]
    after = body_of(
        "claude-code/captured-requests/messages_after_unknown_recall_tool_use_request.json"
    )
    assert new_input_messages(after) == [
        Message(
            "tool",
            "[tool:toolu_01fake] <tool_use_error>Error: No such tool available: recall"
            "</tool_use_error>",
        )
    ]
