"""Gemini text records read in one go (``text_records``).

A live round (``GeminiRound.take``, ``driver.relay_reads``): whatever the stream
and however it is cut into reads, the client gets the same bytes, the round
ends in the same state and a bad record fails the same way as when every record
is decoded and fed. Storage (``answer_scan.plain_text``): it stores exactly
what the full parse (``TurnCollector``) stores, or leaves the stream to it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from lore_gateway.collector import TurnCollector
from lore_gateway.memory.store.answer_scan import plain_text
from lore_gateway.protocols.gemini_stream import GeminiAccumulator, text_records
from lore_gateway.recall.core import driver
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.recall.gemini.live import GeminiRecallStream
from lore_gateway.routing import Protocol
from lore_gateway.sse import SSEDecoder, SSEEvent

HEAD = {"modelVersion": "gemini-fake", "responseId": "r-1"}
END = b"\r\n\r\n"


def _record(parts: list[Any], *, finish: str | None = None, usage: int = 1,
            **extra: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return {"candidates": [candidate],
            "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": usage,
                              "totalTokenCount": 12 + usage}, **HEAD, **extra}


def _frame(record: Any) -> bytes:
    return b"data: " + orjson.dumps(record) + END


def _text_answer(text: str, pieces: int = 12) -> list[bytes]:
    step = max(1, len(text) // pieces)
    chunks = [text[at:at + step] for at in range(0, len(text), step)]
    frames = [_frame(_record([{"text": chunk}], usage=n + 1)) for n, chunk in enumerate(chunks)]
    return [*frames, _frame(_record([], finish="STOP", usage=len(chunks) + 1))]


TEXT = "The deploy target is the blue cluster, rotated weekly — by the platform team."
RECALL = {"functionCall": {"name": RECALL_TOOL_NAME, "args": {"query": "deploy target"}}}

# Streams whose records the fast path must read exactly as the general path does,
# or leave to it.
STREAMS: dict[str, list[bytes]] = {
    "text": _text_answer(TEXT),
    "ascii": _text_answer("plain ascii text, nothing else " * 4),
    "recall": [*_text_answer(TEXT)[:4], _frame(_record([RECALL])),
               _frame(_record([{"text": "after"}])), _frame(_record([], finish="STOP"))],
    "thought": [_frame(_record([{"text": "hmm", "thought": True}])),
                _frame(_record([{"text": "more", "thought": True}])),
                *_text_answer(TEXT)],
    "signature": [_frame(_record([{"text": "a", "thoughtSignature": "c2ln"}])),
                  *_text_answer(TEXT)],
    "no role, null role, no parts": [
        _frame({"candidates": [{"content": {"parts": [{"text": "a"}]}, "index": 0}]}),
        _frame({"candidates": [{"content": {"parts": [{"text": "b"}], "role": None}}]}),
        _frame({"candidates": [{"content": {"role": "model"}}], "usageMetadata": None}),
        _frame({"candidates": [{"content": {"parts": [], "role": "user"}}],
                "createTime": "2026-12-05T00:00:00Z"}),
        *_text_answer(TEXT)],
    "empty texts": [_frame(_record([{"text": ""}])), _frame(_record([{"text": ""}, {"text": ""}])),
                    *_text_answer(TEXT)],
    "huge count": [_frame(_record([{"text": "a"}], usage=7)).replace(b":7,", b":%d," % 2**70),
                   *_text_answer(TEXT)],
    # The run's last role and usage are what the finish record leaves standing.
    "kept from the run": [
        _frame({"candidates": [{"content": {"parts": [{"text": "a"}], "role": "user"}}]}),
        _frame(_record([{"text": "b"}], usage=7)).replace(b":7,", b":%d," % 2**70)
        .replace(b'"role":"model"', b'"role":"user"'),
        _frame({"candidates": [{"content": {"parts": []}, "finishReason": "STOP"}]})],
    "infinite count": [_frame(_record([{"text": "a"}], usage=7)).replace(b":7,", b":1e400,"),
                       *_text_answer(TEXT)],
    "float count": [_frame(_record([{"text": "a"}], usage=7)).replace(b":7,", b":7.5,"),
                    *_text_answer(TEXT)],
    "uint64 count": [_frame(_record([{"text": "a"}], usage=7)).replace(b":7,", b":%d," % 2**63),
                     *_text_answer(TEXT)],
    "usage details": [_frame({**_record([{"text": "a"}]), "usageMetadata": {
        "promptTokenCount": 3, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 3}],
        "trafficType": "ON_DEMAND"}}),
        *_text_answer(TEXT)],
    "other candidate": [_frame({"candidates": [{"content": {"parts": [{"text": "x"}]},
                                                "index": 1}]}), *_text_answer(TEXT)],
    "two candidates": [*_text_answer(TEXT)[:3], _frame({"candidates": [
        {"content": {"parts": [{"text": "x"}]}, "index": 0},
        {"content": {"parts": [{"text": "y"}]}, "index": 1}]}), *_text_answer(TEXT)[3:]],
    "safety ratings": [_frame({**_record([{"text": "a"}]), "candidates": [{
        "content": {"parts": [{"text": "a"}], "role": "model"}, "index": 0,
        "safetyRatings": []}]}), *_text_answer(TEXT)],
    "keepalive": [_frame({}), *_text_answer(TEXT)[:3], _frame({}), *_text_answer(TEXT)[3:]],
    "error": [*_text_answer(TEXT)[:3],
              _frame({"error": {"code": 500, "message": "boom", "status": "INTERNAL"}})],
    "broken": [*_text_answer(TEXT)[:3], b'data: {"candidates": [' + END, *_text_answer(TEXT)],
    "null text": [*_text_answer(TEXT)[:2], _frame(_record([{"text": None}])),
                  *_text_answer(TEXT)[2:]],
    "bool index": [_frame({"candidates": [{"content": {"parts": [{"text": "a"}]},
                                           "index": True}]}), *_text_answer(TEXT)],
    "LF endings": [f.replace(END, b"\n\n") for f in _text_answer(TEXT)],
    "two data lines": [*_text_answer(TEXT)[:2],
                       b'data: {"candidates": [{"content":\r\ndata: {"parts": []}}]}' + END,
                       *_text_answer(TEXT)[2:]],
    "after the finish": [*_text_answer(TEXT), *_text_answer(TEXT)[:2]],
    "no finish": _text_answer(TEXT)[:-1],
}


class _Adapter:
    """The calls the relays make of a stream adapter."""

    def __init__(self, live: GeminiRecallStream) -> None:
        self.live = live

    def feed(self, event: SSEEvent) -> bytes:
        return self.live.feed(event)

    def can_take(self) -> bool:
        return self.live.round.can_take()

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        return self.live.round.take(data, max_frames)


class _Reads:
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    async def chunks(self) -> AsyncIterator[bytes]:
        for data in self._reads:
            yield data


class _Client:
    def __init__(self) -> None:
        self.body = b""

    async def write(self, data: bytes) -> None:
        self.body += data


async def _batches(reads: list[bytes]) -> AsyncIterator[list[SSEEvent]]:
    decoder = SSEDecoder()
    for data in reads:
        events = decoder.feed(data)
        if events:
            yield events
    tail = decoder.close()
    if tail:
        yield tail


def _state(live: GeminiRecallStream) -> Any:
    rnd = live.round
    error = None
    try:
        rnd.close()
        parts: Any = rnd.parts()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        parts = None
    return (rnd.acc.response_body(), rnd.acc.done, rnd.hidden, rnd.held, rnd.error,
            rnd._state_bytes, parts, rnd.recalls, error)


def _run(reads: list[bytes], *, fast: bool, max_state: int = 1 << 24) -> tuple[
        bytes, str | None, Any]:
    live = GeminiRecallStream(max_state_bytes=max_state)
    client = _Client()
    adapter: Any = _Adapter(live)
    relay = (driver.relay_reads(adapter, _Reads(reads), client) if fast  # type: ignore[arg-type]
             else driver.relay(adapter, _batches(reads), client))
    try:
        asyncio.run(relay)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    return client.body, error, _state(live)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _cuttings(frames: list[bytes], seed: int) -> list[list[bytes]]:
    """The stream as one read, a read a frame, and random cuts."""
    data = b"".join(frames)
    rng = random.Random(seed)
    out = [[data], frames]
    for _ in range(6):
        out.append(_split(data, [rng.randrange(len(data)) for _ in range(rng.randrange(1, 9))]))
    return out


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_taking_records_matches_feeding_each(name: str) -> None:
    for n, reads in enumerate(_cuttings(STREAMS[name], seed=sum(name.encode()))):
        assert _run(reads, fast=True) == _run(reads, fast=False), (name, n)


@pytest.mark.parametrize("max_state", [50, 200, 400, 800])
def test_the_state_bound_fails_at_the_same_record(max_state: int) -> None:
    frames = _text_answer(TEXT * 4, pieces=20)
    for reads in _cuttings(frames, seed=max_state):
        fast = _run(reads, fast=True, max_state=max_state)
        assert fast == _run(reads, fast=False, max_state=max_state)
        assert fast[1] is not None and "StateLimitExceeded" in fast[1]


def test_a_text_answer_is_mostly_taken_in_one_go() -> None:
    frames = _text_answer(TEXT)
    live = GeminiRecallStream()
    adapter = _Adapter(live)
    fed: list[SSEEvent] = []

    def feed(event: SSEEvent) -> bytes:
        fed.append(event)
        return live.feed(event)

    adapter.feed = feed  # type: ignore[method-assign]
    asyncio.run(driver.relay_reads(adapter, _Reads([b"".join(frames)]),  # type: ignore[arg-type]
                                   _Client()))
    assert len(fed) == 1  # only the record with the finishReason is decoded


def test_text_records_stop_before_a_finish_and_a_function_call() -> None:
    frames = _text_answer(TEXT)
    data = b"".join(frames)
    run = text_records(data, 1000)
    assert run is not None
    assert len(run.records) == len(frames) - 1
    assert run.size == len(data) - len(frames[-1])
    assert text_records(data, 3) is None  # more frames than the decoder has room for
    call = _frame(_record([RECALL]))
    run = text_records(frames[0] + call + frames[1], 1000)
    assert run is not None and run.size == len(frames[0])


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_accumulator_applies_a_run_as_each_record(name: str) -> None:
    """``apply_text_run`` on each run the stream's frames allow, the rest applied
    one by one, against every record applied one by one."""
    frames = STREAMS[name]
    slow, fast = GeminiAccumulator(max_text_chars=40), GeminiAccumulator(max_text_chars=40)
    for frame in frames:
        _feed(slow, frame)
    at = 0
    while at < len(frames):
        run = text_records(b"".join(frames[at:]), 1000) if fast.can_take() else None
        if run is None:
            _feed(fast, frames[at])
            at += 1
            continue
        fast.apply_text_run(run)
        at += len(run.records)
    assert _outcome(fast) == _outcome(slow)


def _feed(acc: GeminiAccumulator, frame: bytes) -> None:
    events = SSEDecoder().feed(frame)
    for event in events:
        with contextlib.suppress(Exception):  # the outcome compares the broken state
            acc.feed_event(event)


def _outcome(acc: GeminiAccumulator) -> Any:
    try:
        result: Any = acc.result()
    except Exception as exc:
        result = f"{type(exc).__name__}: {exc}"
    return acc.response_body(), acc.done, result, acc.can_take()


# Streams storage reads itself (every other stream here it leaves to the full parse).
SCANNED = {"text", "ascii", "recall", "thought", "signature", "no role, null role, no parts",
           "empty texts", "huge count", "float count", "uint64 count", "usage details",
           "other candidate", "two candidates",
           "safety ratings", "keepalive", "after the finish", "null text"}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_storage_reads_a_gemini_answer_as_the_full_parse(name: str) -> None:
    body = b"".join(STREAMS[name])
    collector = TurnCollector(Protocol.GEMINI, max_json_bytes=len(body) + 1,
                              max_text_chars=len(body))
    collector.feed(body)
    scanned = plain_text("gemini", body)
    if name in SCANNED:
        assert scanned == collector.outputs()
    else:
        assert scanned is None
