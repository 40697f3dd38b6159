"""The Gemini protocol model: records in, the answer and a turn's messages out."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lore_gateway.protocols import gemini
from lore_gateway.protocols.accumulator import StateLimitExceeded, StreamAccumulator
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.gemini_stream import (
    MAX_PARTS,
    GeminiAccumulator,
    JsonArrayDecoder,
    usage_from_gemini,
)
from lore_gateway.protocols.usage import Usage
from lore_gateway.sse import SSEDecoder

USAGE = {"promptTokenCount": 120, "cachedContentTokenCount": 100, "candidatesTokenCount": 7,
         "thoughtsTokenCount": 5, "totalTokenCount": 132}


def _record(parts: list[dict[str, Any]], finish: str | None = None,
            usage: dict[str, Any] | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    record: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-fake",
                              "responseId": "resp-1"}
    if usage:
        record["usageMetadata"] = usage
    return record


RECORDS = [
    _record([{"text": "Planning", "thought": True}]),
    _record([{"text": "Hi "}]),
    _record([{"text": "there", "thoughtSignature": "sig"}]),
    _record([{"functionCall": {"name": "read_file", "args": {"path": "a.py"}, "id": "c1"}}],
            "STOP", USAGE),
]


def _feed_sse(acc: GeminiAccumulator, frames: list[bytes]) -> None:
    decoder = SSEDecoder()
    for frame in frames:
        for event in decoder.feed(frame):
            acc.feed_event(event)
    for event in decoder.close():
        acc.feed_event(event)
    acc.close()


def test_sse_records_accumulate_into_one_answer() -> None:
    acc: StreamAccumulator = GeminiAccumulator()
    assert isinstance(acc, GeminiAccumulator)
    _feed_sse(acc, gemini.stream_from_response(RECORDS))
    result = acc.result()
    assert acc.done and result.finish_reason == "STOP"
    assert (result.id, result.model, result.text, result.thoughts) == (
        "resp-1", "gemini-fake", "Hi there", "Planning")
    assert [(c.call_id, c.name, orjson.loads(c.arguments)) for c in result.tool_calls] == [
        ("c1", "read_file", {"path": "a.py"})]
    assert result.usage == Usage(input_tokens=20, output_tokens=12, cache_read=100,
                                 reasoning_tokens=5)
    body = acc.response_body()
    assert body["candidates"][0]["content"]["parts"] == [
        {"text": "Planning", "thought": True},
        {"text": "Hi there", "thoughtSignature": "sig"},
        {"functionCall": {"name": "read_file", "args": {"path": "a.py"}, "id": "c1"}}]
    assert body["usageMetadata"] == USAGE and body["responseId"] == "resp-1"


def test_the_body_streams_back_into_the_same_answer() -> None:
    acc = GeminiAccumulator()
    _feed_sse(acc, gemini.stream_from_response(RECORDS))
    again = GeminiAccumulator()
    _feed_sse(again, gemini.stream_from_response(acc.response_body()))
    assert again.response_body() == acc.response_body()
    assert gemini.output_messages(again) == [
        Message("assistant", "[reasoning] Planning"), Message("assistant", "Hi there"),
        Message("assistant", '[tool_call:read_file] {"path": "a.py"}')]


@pytest.mark.parametrize("cut", [1, 2, 5, 17, 1000])
def test_an_array_stream_gives_the_same_records_however_it_is_cut(cut: int) -> None:
    data = b"".join(gemini.array_stream([*RECORDS, _record([{"text": "a\"]}\\"}])]))
    decoder = JsonArrayDecoder()
    records: list[bytes] = []
    for at in range(0, len(data), cut):
        records.extend(decoder.feed(data[at:at + cut]))
    decoder.close()
    assert [orjson.loads(r) for r in records] == [*RECORDS, _record([{"text": "a\"]}\\"}])]
    acc = GeminiAccumulator()
    for record in records[:-1]:
        acc.feed_record(record)
    acc.close()
    assert acc.result().text == "Hi there"


@pytest.mark.parametrize("data", [b"{}", b"[1]", b"[{}] x"])
def test_an_array_stream_that_is_not_one_fails(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        JsonArrayDecoder().feed(data)


def test_an_unclosed_array_fails_at_close() -> None:
    decoder = JsonArrayDecoder()
    assert decoder.feed(b'[{"a": 1}') == [b'{"a": 1}']
    with pytest.raises(ProtocolError, match="before its"):
        decoder.close()


def test_an_error_record_fails_the_stream_and_is_kept() -> None:
    acc = GeminiAccumulator()
    acc.apply(RECORDS[1])
    error = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    with pytest.raises(ProtocolError, match="Gemini stream error"):
        acc.apply(error)
    assert acc.error_event == error
    with pytest.raises(ProtocolError):  # unusable afterwards
        acc.apply(RECORDS[2])


def test_a_stream_without_a_finish_is_incomplete() -> None:
    acc = GeminiAccumulator()
    acc.apply(RECORDS[1])
    with pytest.raises(ProtocolError, match="finishReason"):
        acc.close()
    assert acc.result().text == "Hi "


def test_a_blocked_prompt_ends_the_answer() -> None:
    acc = GeminiAccumulator()
    acc.apply({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": USAGE})
    acc.close()
    assert acc.response_body()["promptFeedback"] == {"blockReason": "SAFETY"}
    assert acc.result().text == "" and acc.result().finish_reason is None


def test_malformed_records_fail() -> None:
    for bad in (b"[]", b'{"candidates": 3}', b'{"candidates": [{"content": {"parts": 1}}]}',
                b"{nope"):
        with pytest.raises(ProtocolError):
            GeminiAccumulator().feed_record(bad)


def test_parts_are_bounded() -> None:
    acc = GeminiAccumulator()
    call = {"functionCall": {"name": "f", "args": {}}}
    acc.apply(_record([call] * MAX_PARTS))
    with pytest.raises(StateLimitExceeded):
        acc.apply(_record([call]))


def test_storage_keeps_a_bounded_text() -> None:
    acc = GeminiAccumulator(max_text_chars=4)
    acc.apply(_record([{"text": "abcdefgh"}], "STOP"))
    assert acc.result().text == "abcd"


def test_usage_conversion() -> None:
    assert usage_from_gemini({"promptTokenCount": 10, "candidatesTokenCount": 3}) == Usage(
        input_tokens=10, output_tokens=3)
    with pytest.raises(ProtocolError):
        usage_from_gemini({"promptTokenCount": -1})


def test_new_input_messages_after_the_model_turn() -> None:
    body = {"systemInstruction": {"parts": [{"text": "be brief"}]}, "contents": [
        {"role": "user", "parts": [{"text": "old"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "ls", "response": {"output": "a.py"}}},
            {"function_response": {"name": "cat", "response": {"lines": 2}}}]},
        {"parts": [{"text": "and now?"}]},
    ]}
    assert gemini.new_input_messages(body) == [
        Message("tool", "[tool:ls] a.py"), Message("tool", '[tool:cat] {"lines": 2}'),
        Message("user", "and now?")]


def test_sse_framing_is_the_apis() -> None:
    assert gemini.sse_frame({"a": 1}) == b'data: {"a":1}\r\n\r\n'
    assert gemini.array_stream([{"a": 1}, {"b": 2}]) == [b'[{"a":1}', b'\r\n,\r\n{"b":2}',
                                                         b"]"]
    assert gemini.array_stream([]) == [b"[]"]


@pytest.mark.parametrize("records", [RECORDS, RECORDS[:2], [
    _record([{"text": 'a "usageMetadata": {"promptTokenCount": 9} in the text'}], "STOP")]])
def test_the_usage_read_alone_is_the_collectors(records: list[dict[str, Any]]) -> None:
    from lore_gateway.collector import TurnCollector, stream_usage
    from lore_gateway.routing import Protocol

    body = b"".join(gemini.stream_from_response(records))
    collector = TurnCollector(Protocol.GEMINI, max_json_bytes=len(body) + 1)
    collector.feed(body)
    assert stream_usage(Protocol.GEMINI, body) == collector.usage()
