"""The Anthropic recall shell against the fake upstream on loopback and a real memory."""

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
from lore_gateway.recall.anthropic.handler import buffered_recall, stream_recall
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import RecallContext, StagedRecall, read_json_principal
from lore_gateway.recall.core.executor import RecallExecutor
from lore_gateway.recall.core.tool import inject
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import UpstreamClient

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")
FACT = "Our deploy target is the blue cluster in eu-west-3."
HEADERS = [("x-api-key", "sk-ant-test-fake"), ("anthropic-version", "2023-06-01"),
           ("content-type", "application/json")]


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    mem.submit_turn(TurnRecord(
        identity=IDENT, protocol="anthropic", model="m",
        messages=(Message("user", FACT), Message("assistant", "Noted.")),
        created_at=time.time()))
    mem.flush(10)
    yield mem
    mem.close()


class Sink:
    """The ASGI server side of a response: records what the client would get."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.ended = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = message["headers"]
        else:
            self.body += message["body"]
            self.ended = not message["more_body"]

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        decoder = SSEDecoder()
        frames = decoder.feed(bytes(self.body)) + decoder.close()
        return [(f.name, json.loads(f.data)) for f in frames if f.has_data]


def request_body(stream: bool) -> dict[str, Any]:
    body = {"model": "claude-fake", "max_tokens": 1000, "stream": stream,
            "messages": [{"role": "user", "content": "Where do we deploy?"}],
            "tools": [{"name": "Read", "description": "read a file",
                       "input_schema": {"type": "object", "properties": {}}}]}
    injected = inject("anthropic", body)
    assert injected is not None
    return injected


def context(upstream: UpstreamClient, fake: FakeUpstream, memory: Memory, body: dict[str, Any],
            delivered: list[StagedRecall]) -> RecallContext:
    return RecallContext(upstream=upstream, url=fake.url + "/v1/messages", headers=HEADERS,
                         body=body, executor=RecallExecutor(memory, IDENT),
                         budget=RecallChainBudget(), on_delivered=delivered.extend)


async def test_streaming_client_sees_three_envelopes_and_recalled_fact(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    sink = Sink()
    delivered: list[StagedRecall] = []
    await stream_recall(context(upstream, fake, memory, body, delivered), principal,
                        ClientChannel(sink), [(b"content-type", b"text/event-stream")])
    events = sink.events()
    assert sink.ended
    assert not any(n == "content_block_start" and b["content_block"]["type"] == "tool_use"
                   for n, b in events)
    starts = [b["message"]["id"] for n, b in events if n == "message_start"]
    assert len(starts) == 3 and starts[1].startswith("lore_marker_")
    assert sum(1 for n, _ in events if n == "message_stop") == 3
    text = "".join(b["delta"].get("text", "") for n, b in events if n == "content_block_delta")
    assert "According to memory: - (user" in text and FACT in text
    assert '📚 Searching all archives for "deploy target"…' in text
    # the follow-up went upstream streamed, with the exact pair appended and recall declared
    first, follow = fake.model_requests
    assert follow.json["stream"] is True
    assert follow.json["messages"][:-2] == first.json["messages"]
    assistant, result = follow.json["messages"][-2:]
    assert assistant["content"][-1]["name"] == "recall"
    assert result["content"][0]["tool_use_id"] == assistant["content"][-1]["id"]
    assert "blue cluster" in result["content"][0]["content"]
    assert any(t.get("name") == "recall" for t in follow.json["tools"])
    (staged,) = delivered
    assert staged.assistant == assistant and staged.tool_result == result


async def test_non_streaming_client_gets_json_with_marker_and_header(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    delivered: list[StagedRecall] = []
    ctx = context(upstream, fake, memory, body, delivered)
    status, out, headers = await buffered_recall(ctx, await read_json_principal(principal))
    assert status == 200
    assert (b"x-lore-recall-invoked", b"true") in headers
    message = json.loads(out)
    # preamble text, the marker where the recall was, the continuation
    assert [b["type"] for b in message["content"]] == ["text", "text", "text"]
    assert message["content"][1]["text"].startswith("📚 Searching all archives")
    assert "According to memory" in message["content"][2]["text"]
    assert [r.json["stream"] for r in fake.model_requests] == [False, False]


async def test_follow_up_failure_recovers_once(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "status-500", "recall:deploy target"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    ctx = context(upstream, fake, memory, body, [])
    status, out, _ = await buffered_recall(ctx, await read_json_principal(principal))
    assert status == 200
    assert "According to memory" in json.loads(out)["content"][-1]["text"]
    assert len(fake.model_requests) == 3
    recovery = fake.model_requests[-1].json["messages"][-1]["content"][0]["content"]
    assert "Do not request recall again" in recovery


async def test_follow_up_and_recovery_failure_is_502(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=False)
    fake.script(["recall:deploy target", "status-500", "status-500"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    delivered: list[StagedRecall] = []
    ctx = context(upstream, fake, memory, body, delivered)
    status, out, _ = await buffered_recall(ctx, await read_json_principal(principal))
    assert status == 502
    assert json.loads(out) == {"type": "error", "error": {
        "type": "server_error", "message": "Recall continuation failed"}}
    assert delivered == [] and ctx.staged == []


async def test_streaming_failure_without_recovery_ends_with_error_event(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "status-500", "status-500"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    sink = Sink()
    delivered: list[StagedRecall] = []
    await stream_recall(context(upstream, fake, memory, body, delivered), principal,
                        ClientChannel(sink), [(b"content-type", b"text/event-stream")])
    events = sink.events()
    assert events[-1][0] == "error"
    assert events[-1][1]["error"]["message"] == "Lore could not continue the response after recall"
    assert delivered == []


async def test_pings_keep_the_client_alive_while_the_follow_up_is_slow(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body(stream=True)
    fake.script(["recall:deploy target", "slow:0.4"])
    principal = await upstream.send("POST", fake.url + "/v1/messages", HEADERS,
                                    orjson.dumps(body))
    sink = Sink()
    ctx = context(upstream, fake, memory, body, [])
    ctx.keepalive_seconds = 0.05
    await stream_recall(ctx, principal, ClientChannel(sink), [])
    names = [n for n, _ in sink.events()]
    stops = [i for i, n in enumerate(names) if n == "message_stop"]
    between = names[stops[1] + 1:names.index("message_start", stops[1])]
    assert len(between) >= 3 and set(between) == {"ping"}
    assert names.count("message_stop") == 3
