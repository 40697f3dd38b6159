"""The fake upstream itself: what the gateway's tests rely on it to do.

These talk to the fake directly, so a broken fake shows up here and not as a
puzzling gateway failure.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import orjson
import zstandard

from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.testing.fake_wire import bench_text, recall_answer_text


def _events(raw: bytes) -> list[tuple[str | None, str]]:
    decoder = SSEDecoder()
    frames = decoder.feed(raw) + decoder.close()
    return [(f.event, f.data) for f in frames if f.has_data]


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, object],
                **headers: str) -> tuple[int, Mapping[str, str], bytes]:
    async with http.post(url, json=body, headers=headers) as response:
        return response.status, response.headers, await response.read()


async def test_responses_text_stream_is_complete_and_recorded(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"model": "gpt-x", "input": "hi", "stream": True}
    status, headers, raw = await _post(http, fake_upstream.url + "/v1/responses", body,
                                       authorization="Bearer sk-1")
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = _events(raw)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    completed = orjson.loads(events[-1][1])["response"]
    assert completed["model"] == "gpt-x"
    assert completed["output"][0]["content"][0]["text"] == fake_upstream.text
    (record,) = fake_upstream.requests
    assert record.path == "/v1/responses" and record.json == body
    assert record.headers["authorization"] == "Bearer sk-1"


async def test_every_shape_answers_json_when_not_streaming(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    url = fake_upstream.url
    _, _, raw = await _post(http, url + "/v1/responses", {"model": "m", "input": "x"})
    assert orjson.loads(raw)["output"][0]["content"][0]["text"] == fake_upstream.text
    _, _, raw = await _post(http, url + "/v1/chat/completions", {"model": "m", "messages": []})
    assert orjson.loads(raw)["choices"][0]["message"]["content"] == fake_upstream.text
    _, _, raw = await _post(http, url + "/v1/messages", {"model": "m", "messages": []})
    assert orjson.loads(raw)["content"] == [{"type": "text", "text": fake_upstream.text}]
    _, _, raw = await _post(http, url + "/v1/messages/count_tokens", {"model": "m"})
    assert orjson.loads(raw)["input_tokens"] >= 1


async def test_chat_stream_is_data_only_and_ends_with_done(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    body = {"model": "m", "messages": [], "stream": True}
    _, _, raw = await _post(http, fake_upstream.url + "/v1/chat/completions", body)
    events = _events(raw)
    assert all(name is None for name, _ in events)
    assert events[-1][1] == "[DONE]"


async def test_codex_backend_rejects_non_stream_and_max_output_tokens(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    url = fake_upstream.url + "/backend-api/codex/responses"
    status, _, raw = await _post(http, url, {"model": "m", "input": "x", "stream": False})
    assert (status, raw) == (400, b'{"detail":"Stream must be set to true"}')
    status, _, _ = await _post(http, url, {"model": "m", "stream": True, "max_output_tokens": 5})
    assert status == 400
    status, headers, _ = await _post(http, url, {"model": "m", "input": "x", "stream": True})
    assert status == 200 and headers["x-codex-primary-used-percent"] == "12.5"


async def test_compressed_request_bodies_are_recorded_decoded(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    body = orjson.dumps({"model": "m", "input": "zipped", "stream": True})
    for encoding, packed in (("zstd", zstandard.ZstdCompressor().compress(body)),
                             ("gzip", gzip.compress(body))):
        async with http.post(fake_upstream.url + "/v1/responses", data=packed, headers={
            "content-encoding": encoding, "content-type": "application/json"}) as response:
            assert response.status == 200
    assert [r.json["input"] for r in fake_upstream.requests] == ["zipped", "zipped"]


async def test_recall_scenario_calls_the_tool_then_quotes_its_output(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.default_scenario = "recall:deploy steps"
    url = fake_upstream.url + "/v1/responses"
    _, _, raw = await _post(http, url, {"model": "m", "input": "hi"})
    call = orjson.loads(raw)["output"][0]
    assert call["name"] == "recall" and orjson.loads(call["arguments"]) == {"query": "deploy steps"}
    follow_up = {"model": "m", "input": [
        {"role": "user", "content": "hi"}, call,
        {"type": "function_call_output", "call_id": call["call_id"],
         "output": "Deploy with make ship\nsecond line"}]}
    _, _, raw = await _post(http, url, follow_up)
    text = orjson.loads(raw)["output"][0]["content"][0]["text"]
    assert text == recall_answer_text("Deploy with make ship") and "make ship" in text


async def test_scripted_scenarios_are_served_in_order_then_default(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.script(["status-429", "failed"])
    url = fake_upstream.url + "/v1/responses"
    statuses = [(await _post(http, url, {"model": "m", "input": "x"}))[0] for _ in range(3)]
    assert statuses == [429, 200, 200]
    assert [r.scenario for r in fake_upstream.requests] == ["status-429", "failed", "text"]


async def test_status_scenario_sends_provider_error_and_rate_limit_headers(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    status, headers, raw = await _post(http, fake_upstream.url + "/v1/messages",
                                       {"model": "m", "messages": []},
                                       **{"x-fake-scenario": "status-529"})
    assert status == 529, headers
    assert headers["retry-after"] == "7" and "request-id" in headers, headers
    assert orjson.loads(raw)["type"] == "error"


async def test_replay_sends_fixture_bytes(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession, fixtures_dir: Path
) -> None:
    name = "codex/upstream-minimal/cli_responses_fixture.sse"
    _, _, raw = await _post(http, fake_upstream.url + "/v1/responses", {"model": "m"},
                            **{"x-fake-replay": name})
    assert raw == (fixtures_dir / name).read_bytes()


async def test_stall_records_that_the_client_left(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    response = await http.post(fake_upstream.url + "/v1/responses",
                               json={"model": "m", "input": "x", "stream": True},
                               headers={"x-fake-scenario": "stall"})
    await response.content.readuntil(b"\n\n")
    response.close()
    (record,) = fake_upstream.requests
    assert await asyncio.to_thread(record.client_gone.wait, 2.0)


async def test_reset_mid_stream_breaks_the_connection(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake_upstream.url + "/v1/responses",
                         json={"model": "m", "input": "x", "stream": True},
                         headers={"x-fake-scenario": "reset-mid-stream:2"}) as response:
        try:
            await response.read()
        except aiohttp.ClientPayloadError:
            return
    raise AssertionError("the stream should have broken")


async def test_big_stream_has_the_requested_size(
    fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    async with http.post(fake_upstream.url + "/v1/responses",
                         json={"model": "m", "input": "x", "stream": True},
                         headers={"x-fake-scenario": "big-stream:2"}) as response:
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
    assert 2 * 1024 * 1024 <= size < 3 * 1024 * 1024


async def test_every_accepted_socket_has_tcp_nodelay() -> None:
    fake = FakeUpstream()
    await fake.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", fake.port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        assert fake._server is not None
        (transport,) = [h.transport for h in fake._server.connections]
        assert transport is not None
        sock = transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
    finally:
        await fake.stop()


def test_bench_text_gives_the_requested_frame_count() -> None:
    from lore_gateway.testing import fake_streams

    answer = fake_streams.responses_text(bench_text(41), "m", 33)
    assert len(answer.frames) == 41
