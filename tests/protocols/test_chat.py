"""Chat Completions accumulator on every recorded stream; requests and turns."""

from __future__ import annotations

import json

import pytest

from lore_gateway.protocols.chat import (
    new_input_messages,
    output_messages,
)
from lore_gateway.protocols.chat_stream import ChatAccumulator
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.sse import SSEEvent

from ._fixtures import FIXTURES, events

CC = FIXTURES / "chat-completions"


def accumulate(name: str) -> ChatAccumulator:
    acc = ChatAccumulator()
    for ev in events(CC / name):
        acc.feed_event(ev)
    acc.close()
    assert acc.done
    return acc


def test_single_tool_call() -> None:
    res = accumulate("tool_call_single.sse").result()
    assert (res.finish_reason, res.stop_reason) == ("tool_calls", "tool_use")
    (call,) = res.tool_calls
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)
    assert res.usage is not None and res.usage.total_tokens > 0


def test_parallel_tool_calls_by_index() -> None:
    acc = accumulate("tool_calls_parallel_two.sse")
    res = acc.result()
    assert [c.name for c in res.tool_calls] == ["GetWeatherArgs", "get_stock_price"]
    assert all(json.loads(c.arguments) for c in res.tool_calls)
    body = acc.response_body()
    assert body["object"] == "chat.completion" and body["usage"]["total_tokens"] == 209
    assert body["choices"][0]["message"]["content"] is None
    assert output_messages(res)[0].text.startswith("[tool_call:GetWeatherArgs] {")


def test_text_with_logprobs_and_length() -> None:
    res = accumulate("text_stream_logprobs_finish_stop_with_usage.sse")
    body = res.response_body()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["logprobs"]["content"]
    assert res.result().text and res.result().stop_reason == "end_turn"
    cut = accumulate("text_stream_finish_length_with_usage.sse").result()
    assert cut.stop_reason == "max_tokens" and cut.text


def _data(payload: str) -> SSEEvent:
    return SSEEvent(event=None, data=payload, has_data=True, raw=b"")


def test_errors() -> None:
    acc = ChatAccumulator()
    with pytest.raises(ProtocolError, match="^malformed JSON in Chat Completions chunk$"):
        acc.feed_event(_data("{x"))
    acc = ChatAccumulator()
    with pytest.raises(ProtocolError, match="^Chat Completions stream error event$"):
        acc.feed_event(_data('{"error": {"message": "boom"}}'))
    assert acc.error_event == {"error": {"message": "boom"}}
    acc = ChatAccumulator()
    acc.feed_event(_data('{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}'))
    with pytest.raises(ProtocolError, match="^upstream OpenAI request did not complete$"):
        acc.close()
    with pytest.raises(ProtocolError, match="^malformed OpenAI response tool identity$"):
        acc.feed_event(_data('{"choices":[{"index":0,"delta":{"tool_calls":[{"index":-1}]}}]}'))


def test_apply_says_whether_a_one_choice_reader_may_relay_the_chunk() -> None:
    """``apply``'s answer is what the live round relays a chunk on unread: the
    first choice alone (or none), no tool call, a delta that is an object."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def applied(acc: ChatAccumulator, choices: object, **extra: object) -> bool:
        return acc.apply({**head, "choices": choices, **extra})

    acc = ChatAccumulator()
    first = {"index": 0, "delta": {"role": "assistant", "content": "hi", "refusal": None},
             "logprobs": None, "finish_reason": None}
    assert applied(acc, [first])
    assert applied(acc, [{"index": 0, "delta": {"content": " there"}}])  # the fast path
    assert applied(acc, [{"index": 0, "delta": {"tool_calls": None}}])
    assert applied(acc, [{"index": 0, "delta": {}, "finish_reason": "stop"}])
    assert applied(acc, [], usage={"prompt_tokens": 1})
    assert acc.apply({"usage": None})
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": ""}}
    acc = ChatAccumulator()
    assert not applied(acc, [{"index": 0, "delta": {"tool_calls": [call]}}])
    assert not applied(acc, [{"index": 0, "delta": {"content": "x"}},
                             {"index": 1, "delta": {"content": "y"}}])
    assert not applied(acc, [{"index": 1, "delta": {"content": "y"}}])
    assert not applied(acc, [{"index": 0, "delta": "text"}])
    assert applied(acc, [{"index": 0, "delta": None}])


def test_requests_and_turns() -> None:
    body = {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "recall"}}],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "old"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1"}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
        ],
    }
    assert new_input_messages(body) == [
        Message("tool", "[tool:call_1] 42"),
        Message("user", "and now?"),
    ]
