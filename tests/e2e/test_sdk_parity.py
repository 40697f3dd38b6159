"""The official SDKs get through the gateway exactly what they get directly.

Every test makes the same call twice, once against the fake upstream and once
through the gateway, and compares the SDK-level results (``model_dump()`` of
responses and of every streamed event). The fake's answers are deterministic,
so any difference is the gateway's doing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lore_gateway.testing import FakeUpstream, RecordedRequest

INPUT = [{"role": "user", "content": "say hi"}]


def _dump(value: Any) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value.model_dump(mode="json", warnings=False)


def both(direct: Any, via: Any, call: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``call`` against the fake directly, then through the gateway; dumped results."""
    return _dump(call(direct)), _dump(call(via))


def _last_two(fake: FakeUpstream) -> tuple[RecordedRequest, RecordedRequest]:
    direct, via = fake.model_requests[-2:]
    return direct, via


# Headers that describe one hop's connection or encoding, which a proxy may change.
HOP_HEADERS = {"connection", "host", "content-length", "accept-encoding", "transfer-encoding",
               "keep-alive", "te", "trailer", "upgrade", "proxy-connection"}


def assert_forwarded_faithfully(fake: FakeUpstream) -> None:
    """Upstream saw the same path, end-to-end headers (credentials included) and body."""
    direct, via = _last_two(fake)
    assert via.path == direct.path
    assert "authorization" in via.headers or "x-api-key" in via.headers
    end_to_end = {k: v for k, v in direct.headers.items() if k not in HOP_HEADERS}
    assert {k: v for k, v in via.headers.items() if k not in HOP_HEADERS} == end_to_end
    strip = {"tools"}  # the gateway may add its own recall tool here in later issues
    assert {k: v for k, v in via.json.items() if k not in strip} == {
        k: v for k, v in direct.json.items() if k not in strip
    }


# ----------------------------------------------------------------------- openai


def test_responses_create(openai_direct: Any, openai_client: Any,
                          fake_upstream: FakeUpstream) -> None:
    direct, via = both(openai_direct, openai_client,
                       lambda c: c.responses.create(model="gpt-fake", input=INPUT))
    assert via == direct
    assert via["output"][0]["content"][0]["text"] == fake_upstream.text
    assert_forwarded_faithfully(fake_upstream)


def test_responses_create_stream(openai_direct: Any, openai_client: Any,
                                 fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        return list(client.responses.create(model="gpt-fake", input=INPUT, stream=True))

    direct, via = both(openai_direct, openai_client, call)
    assert via == direct
    assert via[-1]["type"] == "response.completed"
    assert_forwarded_faithfully(fake_upstream)


def test_responses_stream_helper_final_response(openai_direct: Any, openai_client: Any,
                                                fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        with client.responses.stream(model="gpt-fake", input=INPUT) as stream:
            events = list(stream)
            return [*events, stream.get_final_response()]

    direct, via = both(openai_direct, openai_client, call)
    assert via == direct
    final = via[-1]
    assert final["output"][0]["content"][0]["text"] == fake_upstream.text


@pytest.mark.parametrize("fixture", [
    "openai-responses/function_call_single_get_weather.chunks.jsonl",
    "openai-responses/text_two_messages_with_phase.chunks.jsonl",
    "codex/served-streams/text_full_accepted.sse",
])
def test_responses_stream_helper_on_recorded_streams(openai_direct: Any, openai_client: Any,
                                                     fixture: str) -> None:
    def call(client: Any) -> Any:
        with client.responses.stream(model="gpt-fake", input=INPUT,
                                     extra_headers={"x-fake-replay": fixture}) as stream:
            for _ in stream:
                pass
            return stream.get_final_response()

    direct, via = both(openai_direct, openai_client, call)
    assert via == direct and via["output"]


def test_chat_create(openai_direct: Any, openai_client: Any, fake_upstream: FakeUpstream) -> None:
    direct, via = both(openai_direct, openai_client,
                       lambda c: c.chat.completions.create(model="gpt-fake", messages=INPUT))
    assert via == direct
    assert via["choices"][0]["message"]["content"] == fake_upstream.text
    assert_forwarded_faithfully(fake_upstream)


def test_chat_create_stream_with_usage(openai_direct: Any, openai_client: Any,
                                       fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        return list(client.chat.completions.create(
            model="gpt-fake", messages=INPUT, stream=True,
            stream_options={"include_usage": True}))

    direct, via = both(openai_direct, openai_client, call)
    assert via == direct
    assert via[-1]["usage"]["total_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in via if c["choices"])
    assert text == fake_upstream.text


def test_chat_stream_helper_with_recorded_tool_calls(openai_direct: Any,
                                                     openai_client: Any) -> None:
    def call(client: Any) -> Any:
        with client.chat.completions.stream(
            model="gpt-fake", messages=INPUT,
            extra_headers={"x-fake-replay": "chat-completions/tool_calls_parallel_two.sse"},
        ) as stream:
            for _ in stream:
                pass
            return stream.get_final_completion()

    direct, via = both(openai_direct, openai_client, call)
    assert via == direct
    assert len(via["choices"][0]["message"]["tool_calls"]) == 2


# ----------------------------------------------------------------------- anthropic


def test_messages_create(anthropic_direct: Any, anthropic_client: Any,
                         fake_upstream: FakeUpstream) -> None:
    direct, via = both(anthropic_direct, anthropic_client, lambda c: c.messages.create(
        model="claude-fake", max_tokens=64, messages=INPUT))
    assert via == direct
    assert via["content"][0]["text"] == fake_upstream.text
    assert_forwarded_faithfully(fake_upstream)


def test_messages_create_stream(anthropic_direct: Any, anthropic_client: Any,
                                fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        return list(client.messages.create(model="claude-fake", max_tokens=64,
                                           messages=INPUT, stream=True))

    direct, via = both(anthropic_direct, anthropic_client, call)
    assert via == direct
    assert [e["type"] for e in via][-1] == "message_stop"
    assert_forwarded_faithfully(fake_upstream)


def test_messages_stream_helper_final_message(anthropic_direct: Any, anthropic_client: Any,
                                              fake_upstream: FakeUpstream) -> None:
    def call(client: Any) -> list[Any]:
        with client.messages.stream(model="claude-fake", max_tokens=64,
                                    messages=INPUT) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == fake_upstream.text
        return [final]

    direct, via = both(anthropic_direct, anthropic_client, call)
    assert via == direct


@pytest.mark.parametrize("fixture", [
    "anthropic/sdk__tool_use_response.sse",
    "anthropic/vercel__anthropic-text.chunks.jsonl",
    "claude-code/served_text_accepted.sse",
])
def test_messages_stream_helper_on_recorded_streams(anthropic_direct: Any,
                                                    anthropic_client: Any, fixture: str) -> None:
    def call(client: Any) -> list[Any]:
        with client.messages.stream(model="claude-fake", max_tokens=64, messages=INPUT,
                                    extra_headers={"x-fake-replay": fixture}) as stream:
            events = list(stream)
            return [*events, stream.get_final_message()]

    direct, via = both(anthropic_direct, anthropic_client, call)
    assert via == direct and via[-1]["content"]


def test_anthropic_beta_query_string_reaches_upstream(anthropic_client: Any,
                                                      fake_upstream: FakeUpstream) -> None:
    anthropic_client.messages.create(model="claude-fake", max_tokens=64, messages=INPUT,
                                     extra_query={"beta": "true"})
    (record,) = fake_upstream.model_requests
    assert record.path == "/v1/messages?beta=true"


def test_count_tokens(anthropic_direct: Any, anthropic_client: Any) -> None:
    direct, via = both(anthropic_direct, anthropic_client, lambda c: c.messages.count_tokens(
        model="claude-fake", messages=INPUT))
    assert via == direct and via["input_tokens"] > 0


def test_models_list_passthrough(openai_direct: Any, openai_client: Any) -> None:
    direct, via = both(openai_direct, openai_client, lambda c: list(c.models.list()))
    assert via == direct and via[0]["id"] == "gpt-fake"
