"""One accumulator per protocol: storage and the live recall round read a
recorded stream into the same response (issue 34, item 4)."""

from __future__ import annotations

import pytest

from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator
from lore_gateway.protocols.chat_stream import ChatAccumulator
from lore_gateway.recall.anthropic.live import AnthropicRecallStream
from lore_gateway.recall.chat.live import ChatRecallStream

from ._fixtures import FIXTURES, events


@pytest.mark.parametrize("name", [
    "sdk__tool_use_response.sse",
    "sdk__basic_response.sse",
    "sdk__incomplete_partial_json_response.sse",
    "vercel__anthropic-json-tool.1.chunks.jsonl",
])
def test_anthropic_round_reads_the_stream_as_storage_does(name: str) -> None:
    stored, live = AnthropicAccumulator(), AnthropicRecallStream()
    for event in events(FIXTURES / "anthropic" / name):
        stored.feed_event(event)
        live.feed(event)
    stored.close()
    live.round.close()
    assert live.round.acc.response_body() == stored.response_body()


@pytest.mark.parametrize("name", [
    "tool_call_single.sse",
    "tool_calls_parallel_two.sse",
    "text_stream_logprobs_finish_stop_with_usage.sse",
])
def test_chat_round_reads_the_stream_as_storage_does(name: str) -> None:
    stored, live = ChatAccumulator(), ChatRecallStream()
    for event in events(FIXTURES / "chat-completions" / name):
        stored.feed_event(event)
        live.feed(event)
    stored.close()
    live.round.close()
    assert live.round.acc.response_body() == stored.response_body()
