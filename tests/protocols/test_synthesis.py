"""Synthesised streams are accepted by the SDKs' streaming helpers and round-trip
through our own accumulators. The bytes are served by a tiny aiohttp server on
127.0.0.1; nothing leaves the machine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import openai
import pytest
from aiohttp import web

from lore_gateway.protocols import anthropic as anth
from lore_gateway.protocols import anthropic_stream, chat, chat_stream, responses
from lore_gateway.sse import SSEDecoder

from ._fixtures import FIXTURES

RESPONSE = json.loads(
    (
        FIXTURES
        / "openai-responses"
        / "reasoning_summary_encrypted_3_function_calls.nonstream.json"
    ).read_text()
)
MESSAGE = json.loads((FIXTURES / "anthropic" / "vercel__anthropic-text.json").read_text())
TOOL_MESSAGE = {
    **MESSAGE,
    "content": [
        {"type": "thinking", "thinking": "Weather needs a tool.", "signature": "c2ln"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1727346178,
    "model": "gpt-4o",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": "Looking it up.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
}


def decode(frames: list[bytes]) -> list:
    dec = SSEDecoder()
    return dec.feed(b"".join(frames)) + dec.close()


@pytest.fixture
async def serve() -> AsyncIterator[object]:
    """Start a loopback server that answers every POST with the given frames."""
    runners: list[web.AppRunner] = []

    async def start(frames: list[bytes]) -> str:
        async def handler(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for frame in frames:
                await resp.write(frame)
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def test_responses_synthesis_round_trips_through_the_strict_accumulator() -> None:
    acc = responses.ResponsesAccumulator("public")
    for ev in decode(responses.stream_from_response(RESPONSE)):
        assert ev.event is not None and ev.raw.endswith(b"\n\n")
        acc.feed_event(ev)
    acc.close()
    assert acc.response_body() == RESPONSE
    seqs = [
        json.loads(ev.data)["sequence_number"]
        for ev in decode(responses.stream_from_response(RESPONSE))
    ]
    assert seqs == list(range(len(seqs)))


def test_anthropic_and_chat_synthesis_round_trip() -> None:
    for message in (MESSAGE, TOOL_MESSAGE):
        acc = anthropic_stream.AnthropicAccumulator()
        for ev in decode(anth.stream_from_response(message)):
            acc.feed_event(ev)
        acc.close()
        assert acc.response_body() == message
    cacc = chat_stream.ChatAccumulator()
    for ev in decode(chat.stream_from_response(COMPLETION)):
        assert ev.event is None
        cacc.feed_event(ev)
    cacc.close()
    assert cacc.response_body() == COMPLETION


async def test_openai_responses_stream_helper_accepts_synthesis(serve) -> None:  # type: ignore[no-untyped-def]
    base = await serve(responses.stream_from_response(RESPONSE))
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client.responses.stream(model=RESPONSE["model"], input="hi") as stream:
        final = await stream.get_final_response()
    assert final.id == RESPONSE["id"]
    assert final.output_text == "12 + 7 = 19\n19 × 3 = 57\n57 × 10 = 570\n\nFinal result: 570"
    assert final.usage is not None and final.usage.total_tokens == RESPONSE["usage"]["total_tokens"]


async def test_anthropic_stream_helper_accepts_synthesis(serve) -> None:  # type: ignore[no-untyped-def]
    base = await serve(anth.stream_from_response(TOOL_MESSAGE))
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    async with client.messages.stream(
        model="claude", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = await stream.get_final_message()
    assert final.model_dump(exclude_none=True)["content"] == TOOL_MESSAGE["content"]
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == MESSAGE["usage"]["output_tokens"]


async def test_chat_stream_helper_accepts_synthesis(serve) -> None:  # type: ignore[no-untyped-def]
    base = await serve(chat.stream_from_response(COMPLETION))
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client.chat.completions.stream(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Looking it up."
    assert (
        message.tool_calls is not None
        and message.tool_calls[0].function.arguments == '{"city":"Paris"}'
    )
    assert final.usage is not None and final.usage.total_tokens == 27
