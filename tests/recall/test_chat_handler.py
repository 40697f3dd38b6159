"""The Chat recall shell against the fake upstream on loopback and a real memory."""

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
from lore_gateway.recall.chat import handler as chat_handler
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import RecallContext, StagedRecall, read_json_principal
from lore_gateway.recall.core.executor import RecallExecutor
from lore_gateway.recall.core.tool import inject
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import UpstreamClient

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    mem.submit_turn(TurnRecord(
        identity=IDENT, protocol="chat", model="m",
        messages=(Message("user", "Our deploy target is the blue cluster in eu-west-3."),
                  Message("assistant", "Noted.")),
        created_at=time.time()))
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

HEADERS = [("authorization", "Bearer sk-test-fake"), ("content-type", "application/json")]


def request_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-fake", "stream": stream,
        "messages": [{"role": "user", "content": "Where do we deploy?"}],
        "tools": [{"type": "function", "function": {"name": "Read", "parameters": {}}}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    injected = inject("chat", body)
    assert injected is not None
    return injected


def ctx_for(upstream: UpstreamClient, fake: FakeUpstream, memory: Memory,
            body: dict[str, Any], delivered: list[StagedRecall]) -> RecallContext:
    return RecallContext(upstream=upstream, url=fake.url + "/v1/chat/completions",
                         headers=HEADERS, body=body, executor=RecallExecutor(memory, IDENT),
                         budget=RecallChainBudget(), on_delivered=delivered.extend)


async def test_streaming_client_one_envelope_marker_as_content(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/chat/completions", HEADERS,
                                    orjson.dumps(body))
    sink = Sink()
    delivered: list[StagedRecall] = []
    await chat_handler.stream_recall(ctx_for(upstream, fake, memory, body, delivered),
                                     principal, ClientChannel(sink),
                                     [(b"content-type", b"text/event-stream")])
    decoder = SSEDecoder()
    frames = [f.data for f in decoder.feed(bytes(sink.body)) + decoder.close() if f.has_data]
    assert frames[-1] == "[DONE]" and frames.count("[DONE]") == 1
    chunks = [json.loads(f) for f in frames[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert not any("tool_calls" in ch["delta"] for c in chunks for ch in c["choices"])
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"]
                if ch["finish_reason"]]
    assert finishes == ["stop"]
    content = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    assert '📚 Searching all archives for "deploy target"…' in content
    assert "According to memory" in content
    first, follow = fake.model_requests
    assert follow.json["messages"][:-2] == first.json["messages"]
    assert follow.json["stream"] is True
    assistant, tool = follow.json["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "recall"
    assert tool["role"] == "tool" and "blue cluster" in tool["content"]
    assert len(delivered) == 1


async def test_non_streaming_client_follow_up_is_json(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/chat/completions", HEADERS,
                                    orjson.dumps(body))
    ctx = ctx_for(upstream, fake, memory, body, [])
    status, out, headers = await chat_handler.buffered_recall(
        ctx, await read_json_principal(principal))
    assert status == 200 and (b"x-lore-recall-invoked", b"true") in headers
    message = json.loads(out)["choices"][0]["message"]
    assert "tool_calls" not in message
    assert "📚 Searching all archives" in message["content"]
    assert "According to memory" in message["content"]
    assert [r.json["stream"] for r in fake.model_requests] == [False, False]


async def test_non_streaming_failure_after_recovery_is_502(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "status-500", "status-500"])
    principal = await upstream.send("POST", fake.url + "/v1/chat/completions", HEADERS,
                                    orjson.dumps(body))
    delivered: list[StagedRecall] = []
    ctx = ctx_for(upstream, fake, memory, body, delivered)
    status, out, _ = await chat_handler.buffered_recall(ctx, await read_json_principal(principal))
    assert status == 502
    assert json.loads(out)["error"]["message"] == "Recall continuation failed"
    assert delivered == [] and len(fake.model_requests) == 3


async def test_keepalive_comments_while_the_follow_up_is_slow(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "slow:0.4"])
    principal = await upstream.send("POST", fake.url + "/v1/chat/completions", HEADERS,
                                    orjson.dumps(body))
    sink = Sink()
    ctx = ctx_for(upstream, fake, memory, body, [])
    ctx.keepalive_seconds = 0.05
    await chat_handler.stream_recall(ctx, principal, ClientChannel(sink), [])
    decoder = SSEDecoder()
    frames = decoder.feed(bytes(sink.body)) + decoder.close()
    marker = next(i for i, f in enumerate(frames) if "lore-recall" in f.data)
    after = frames[marker + 1:]
    first_data = next(i for i, f in enumerate(after) if f.has_data)
    assert first_data >= 3
    assert all(f.raw == b": keepalive\n\n" for f in after[:first_data])
    assert [f.data for f in frames if f.has_data][-1] == "[DONE]"
