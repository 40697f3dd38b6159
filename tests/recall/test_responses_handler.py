"""The Responses recall shell against the fake upstream on loopback and a real memory."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.channel import ClientChannel
from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import RecallContext, StagedRecall
from lore_gateway.recall.core.executor import RecallExecutor
from lore_gateway.recall.core.tool import inject
from lore_gateway.recall.responses import handler as responses_handler
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import UpstreamClient

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")
HEADERS = [("authorization", "Bearer sk-test-fake"), ("content-type", "application/json")]


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    mem.submit_turn(
        TurnRecord(
            identity=IDENT,
            protocol="responses",
            model="m",
            messages=(
                Message("user", "Our deploy target is the blue cluster in eu-west-3."),
                Message("assistant", "Noted."),
            ),
            created_at=time.time(),
        )
    )
    mem.flush(10)
    yield mem
    mem.close()


class Sink:
    """The ASGI server side of a response: records what the client would get."""

    def __init__(self) -> None:
        self.body = bytearray()

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.body += message["body"]


def request_body(stream: bool) -> dict[str, Any]:
    body = {
        "model": "gpt-fake",
        "stream": stream,
        "input": "Where do we deploy?",
        "tools": [{"type": "function", "name": "exec", "parameters": {}}],
    }
    injected = inject("responses", body)
    assert injected is not None
    return injected


def ctx_for(
    upstream: UpstreamClient,
    fake: FakeUpstream,
    memory: Memory,
    body: dict[str, Any],
    delivered: list[StagedRecall],
) -> RecallContext:
    return RecallContext(
        upstream=upstream,
        url=fake.url + "/v1/responses",
        headers=HEADERS,
        body=body,
        executor=RecallExecutor(memory, IDENT),
        budget=RecallChainBudget(),
        on_delivered=delivered.extend,
    )


def _client_events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    dec = SSEDecoder()
    return [(e.name, json.loads(e.data)) for e in dec.feed(data) + dec.close() if e.has_data]


async def test_streaming_client_sees_one_seamless_answer(
    upstream: UpstreamClient, fake: FakeUpstream, memory: Memory
) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/responses", HEADERS, orjson.dumps(body))
    sink = Sink()
    delivered: list[StagedRecall] = []
    streamed = await responses_handler.stream_responses_recall(
        ctx_for(upstream, fake, memory, body, delivered),
        principal,
        ClientChannel(sink),
        codex=False,
    )
    events = _client_events(bytes(sink.body))
    names = [n for n, _ in events]
    assert names.count("response.created") == 1 and names[-1] == "response.completed"
    assert b'"name":"recall"' not in sink.body and b"function_call" not in sink.body
    final = events[-1][1]["response"]
    assert final["id"] == events[0][1]["response"]["id"]
    assert "According to memory" in final["output"][-1]["content"][0]["text"]
    first, follow = fake.model_requests
    assert first.json["stream"] is True and follow.json["stream"] is True
    assert [i["type"] for i in follow.json["input"][-2:]] == [
        "function_call",
        "function_call_output",
    ]
    assert "previous_response_id" not in follow.json and follow.json["store"] is False
    result = follow.json["input"][-1]["output"]
    assert "blue cluster" in result
    # The recall result and its private coverage never reach the client directly.
    assert result.encode() not in sink.body and b"coverage" not in sink.body
    assert len(delivered) == 1 and delivered[0].tool_result == follow.json["input"][-1]
    kinds = [i["type"] for i in streamed.interceptor.turn_items()]
    assert kinds[:2] == ["function_call", "function_call_output"]


async def test_keepalive_comments_while_recall_runs(
    upstream: UpstreamClient, fake: FakeUpstream, memory: Memory
) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "stall:0.3"])
    principal = await upstream.send("POST", fake.url + "/v1/responses", HEADERS, orjson.dumps(body))
    sink = Sink()
    await responses_handler.stream_responses_recall(
        ctx_for(upstream, fake, memory, body, []),
        principal,
        ClientChannel(sink),
        codex=False,
        keepalive_seconds=0.05,
    )
    assert b": keepalive\n\n" in sink.body


async def test_non_streaming_public_client_uses_json_follow_ups(
    upstream: UpstreamClient, fake: FakeUpstream, memory: Memory
) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "recall:deploy target"])
    resp = await upstream.send("POST", fake.url + "/v1/responses", HEADERS, orjson.dumps(body))
    principal, _ = await resp.read(1 << 22)
    delivered: list[StagedRecall] = []
    ctx = ctx_for(upstream, fake, memory, body, delivered)
    status, headers, out, _ = await responses_handler.buffered_responses_recall(
        ctx, orjson.loads(principal), codex=False
    )
    assert status == 200 and (b"x-lore-recall-invoked", b"true") in headers
    answer = orjson.loads(out)
    assert not any(i.get("name") == "recall" for i in answer["output"])
    assert "According to memory" in answer["output"][-1]["content"][0]["text"]
    assert answer["output"][0]["content"][0]["text"].startswith("<!-- lore-recall:")
    assert [r.json["stream"] for r in fake.model_requests] == [False, False]
    assert delivered == []  # committed only once the client has the body
    ctx.delivered()
    assert len(delivered) == 1


async def test_non_streaming_codex_client_streams_follow_ups(
    upstream: UpstreamClient, fake: FakeUpstream, memory: Memory
) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "recall:deploy target"])
    resp = await upstream.send("POST", fake.url + "/v1/responses", HEADERS, orjson.dumps(body))
    from lore_gateway.protocols.responses_stream import ResponsesAccumulator

    acc = ResponsesAccumulator("codex")
    dec = SSEDecoder()
    async for chunk in resp.chunks():
        for ev in dec.feed(chunk):
            acc.feed_event(ev)
    status, _headers, out, _ = await responses_handler.buffered_responses_recall(
        ctx_for(upstream, fake, memory, body, []), acc.response_body(), codex=True
    )
    assert status == 200
    assert [r.json["stream"] for r in fake.model_requests] == [True, True]
    assert "According to memory" in orjson.loads(out)["output"][-1]["content"][0]["text"]


async def test_failed_follow_up_and_recovery_give_502(
    upstream: UpstreamClient, fake: FakeUpstream, memory: Memory
) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "status-500", "status-500"])
    resp = await upstream.send("POST", fake.url + "/v1/responses", HEADERS, orjson.dumps(body))
    principal, _ = await resp.read(1 << 22)
    delivered: list[StagedRecall] = []
    status, _, out, _ = await responses_handler.buffered_responses_recall(
        ctx_for(upstream, fake, memory, body, delivered), orjson.loads(principal), codex=False
    )
    assert status == 502
    assert orjson.loads(out) == {
        "type": "error",
        "error": {"type": "server_error", "message": "Recall continuation failed"},
    }
    assert len(fake.model_requests) == 3 and delivered == []
