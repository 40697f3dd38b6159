"""The Gemini recall shell against the strict fake upstream on loopback and a real
memory: the recall hidden, run and answered in the same response, the follow-up's
stream flag in its URL, streamed and not."""

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
from lore_gateway.recall.core.chain import RecallContext, StagedRecall, read_json_principal
from lore_gateway.recall.core.executor import RecallExecutor
from lore_gateway.recall.core.tool import inject
from lore_gateway.recall.gemini.handler import buffered_recall, stream_flag, stream_recall
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.upstream import UpstreamClient

IDENT = Identity(tenant="tenant-a", project="/p", session="s1")
FACT = "Our deploy target is the blue cluster in eu-west-3."
HEADERS = [("x-goog-api-key", "AIza-fake"), ("content-type", "application/json")]
MODEL_PATH = "/v1beta/models/gemini-fake"


@pytest.fixture
def memory(tmp_path: Path, database_url: str | None) -> Iterator[Memory]:
    mem = Memory.open(Settings(data_dir=tmp_path, embeddings=False), embedder=None)
    mem.submit_turn(TurnRecord(
        identity=IDENT, protocol="gemini", model="gemini-fake",
        messages=(Message("user", FACT), Message("assistant", "Noted.")),
        created_at=time.time()))
    mem.flush(10)
    yield mem
    mem.close()


class Sink:
    """The ASGI server side of a response: records what the client would get."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.ended = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message["body"]
            self.ended = not message["more_body"]

    def records(self) -> list[dict[str, Any]]:
        decoder = SSEDecoder()
        frames = decoder.feed(bytes(self.body)) + decoder.close()
        return [json.loads(f.data) for f in frames if f.has_data]


def request_body() -> dict[str, Any]:
    body = {"contents": [{"role": "user", "parts": [{"text": "Where do we deploy?"}]}],
            "tools": [{"functionDeclarations": [{"name": "read_file", "description": "read",
                                                 "parametersJsonSchema": {"type": "object"}}]}]}
    injected = inject("gemini", body)
    assert injected is not None
    return injected


def url(fake: FakeUpstream, stream: bool) -> str:
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"{fake.url}{MODEL_PATH}:{method}"


def context(upstream: UpstreamClient, fake: FakeUpstream, memory: Memory, body: dict[str, Any],
            stream: bool, delivered: list[StagedRecall]) -> RecallContext:
    return RecallContext(upstream=upstream, url=url(fake, stream), headers=HEADERS, body=body,
                         executor=RecallExecutor(memory, IDENT), budget=RecallChainBudget(),
                         on_delivered=delivered.extend, stream_flag=stream_flag)


def parts_text(records: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for r in records for c in r.get("candidates", [])
                   for p in c["content"]["parts"])


async def test_streaming_client_gets_one_answer_with_marker_and_recalled_fact(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body()
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", url(fake, True), HEADERS, orjson.dumps(body))
    sink, delivered = Sink(), []
    one_round = await stream_recall(context(upstream, fake, memory, body, True, delivered),
                                    principal, ClientChannel(sink), [])
    assert sink.ended and one_round is None
    records = sink.records()
    assert "functionCall" not in json.dumps(records)
    text = parts_text(records)
    assert '📚 Searching all archives for "deploy target"…' in text and FACT in text
    finishes = [c.get("finishReason") for r in records for c in r["candidates"]]
    assert finishes[-1] == "STOP" and finishes.count("STOP") == 1
    # The one finish carries both rounds' usage.
    assert records[-1]["usageMetadata"]["promptTokenCount"] == 2 * 12
    # The follow-up streamed in its URL, no stream field in its body, the pair appended.
    first, follow = fake.model_requests
    assert follow.route.endswith(":streamGenerateContent") and "alt=sse" in follow.path
    assert "stream" not in follow.json
    assert follow.json["contents"][:-2] == first.json["contents"]
    model, response = follow.json["contents"][-2:]
    assert model["role"] == "model" and model["parts"][-1]["functionCall"]["name"] == "recall"
    answer = response["parts"][0]["functionResponse"]
    assert answer["name"] == "recall" and "blue cluster" in answer["response"]["output"]
    (staged,) = delivered
    assert (staged.assistant, staged.tool_result) == (model, response)


async def test_non_streaming_client_gets_json_and_the_follow_up_is_generate_content(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body()
    fake.script(["recall:deploy target", "recall:deploy target"])
    principal = await upstream.send("POST", url(fake, False), HEADERS, orjson.dumps(body))
    ctx = context(upstream, fake, memory, body, False, [])
    status, out, headers = await buffered_recall(ctx, await read_json_principal(principal))
    assert status == 200 and (b"x-lore-recall-invoked", b"true") in headers
    answer = json.loads(out)
    parts = answer["candidates"][0]["content"]["parts"]
    assert "functionCall" not in json.dumps(parts)
    assert parts[0]["text"].startswith('📚 Searching all archives for "deploy target"…')
    assert FACT in parts[-1]["text"]
    assert [r.route.rsplit(":", 1)[1] for r in fake.model_requests] == ["generateContent"] * 2
    assert "stream" not in fake.model_requests[1].json


async def test_follow_up_failure_recovers_once_then_fails(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body()
    fake.script(["recall:deploy target", "status-500", "recall:deploy target"])
    principal = await upstream.send("POST", url(fake, False), HEADERS, orjson.dumps(body))
    ctx = context(upstream, fake, memory, body, False, [])
    status, out, _ = await buffered_recall(ctx, await read_json_principal(principal))
    assert status == 200 and FACT in out.decode()
    recovery = fake.model_requests[-1].json["contents"][-1]["parts"][0]["functionResponse"]
    assert "Do not request recall again" in recovery["response"]["output"]

    fake.script(["recall:deploy target", "status-500", "status-500"])
    principal = await upstream.send("POST", url(fake, True), HEADERS, orjson.dumps(body))
    sink, delivered = Sink(), []
    await stream_recall(context(upstream, fake, memory, body, True, delivered), principal,
                        ClientChannel(sink), [])
    last = sink.records()[-1]
    assert last["error"]["message"] == "Lore could not continue the response after recall"
    assert delivered == []


async def test_an_answer_without_recall_goes_out_as_it_came(
        upstream: UpstreamClient, fake: FakeUpstream, memory: Memory) -> None:
    body = request_body()
    fake.script(["text:plain answer"])
    principal = await upstream.send("POST", url(fake, True), HEADERS, orjson.dumps(body))
    sink = Sink()
    one_round = await stream_recall(context(upstream, fake, memory, body, True, []),
                                    principal, ClientChannel(sink), [])
    # Nothing hidden: the client got the upstream's bytes, and its usage is read once.
    assert one_round is not None and one_round.usage is not None
    assert parts_text(sink.records()) == "plain answer"
    assert len(fake.model_requests) == 1
