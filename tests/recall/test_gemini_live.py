"""The sans-IO Gemini recall round and stream: records in, client bytes out."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.core.chain import ExecutedRecall, RecallCall
from lore_gateway.recall.gemini.handler import (
    BufferedAdapter,
    check_response,
    follow_up_pair,
    recovery_contents,
    stream_flag,
)
from lore_gateway.recall.gemini.live import (
    KEEPALIVE,
    GeminiRecallStream,
    GeminiRound,
    content_usable,
    recall_calls,
    sum_usage,
)
from lore_gateway.sse import SSEDecoder, SSEEvent

MARKER = ('📚 Searching all archives for "deploy"…\n'
          "<!-- lore-recall:00000000-0000-4000-8000-000000000000 -->")


def record(parts: list[dict[str, Any]], *, finish: str | None = None,
           usage: dict[str, int] | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-fake",
                           "responseId": "r1"}
    if usage is not None:
        out["usageMetadata"] = usage
    return out


def frame(rec: dict[str, Any]) -> SSEEvent:
    events = SSEDecoder().feed(b"data: " + orjson.dumps(rec) + b"\r\n\r\n")
    assert len(events) == 1
    return events[0]


def records(data: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    return [json.loads(e.data) for e in decoder.feed(data) + decoder.close() if e.has_data]


RECALL = {"functionCall": {"name": "recall", "args": {"query": "deploy"}},
          "thoughtSignature": "sig-1"}
READ = {"functionCall": {"name": "read_file", "args": {"path": "a.py"}}}
USAGE_1 = {"promptTokenCount": 10, "candidatesTokenCount": 2, "totalTokenCount": 12}
USAGE_2 = {"promptTokenCount": 30, "candidatesTokenCount": 5, "totalTokenCount": 35}


def test_a_round_without_recall_goes_out_byte_for_byte() -> None:
    rnd = GeminiRound()
    first, last = frame(record([{"text": "Hel"}])), frame(
        record([{"text": "lo"}], finish="STOP", usage=USAGE_1))
    assert rnd.feed(first) == first.raw
    assert rnd.feed(last) == last.raw
    rnd.close()
    assert rnd.recalls == [] and rnd.visible_tools == 0 and rnd.usable()
    assert rnd.held is None


def test_the_recall_part_is_hidden_and_the_finish_held() -> None:
    rnd = GeminiRound()
    text = frame(record([{"text": "Let me look."}]))
    assert rnd.feed(text) == text.raw
    assert rnd.feed(frame(record([RECALL], finish="STOP", usage=USAGE_1))) == b""
    rnd.close()
    assert rnd.recall_seen
    assert rnd.recalls == [RecallCall("", '{"query":"deploy"}', 1)]
    assert rnd.held is not None and rnd.held["candidates"][0]["content"]["parts"] == []
    # The follow-up replays every part up to the call, its signature with it.
    model, response = follow_up_pair(rnd.parts(), rnd.recalls[0], "the result")
    assert model == {"role": "model", "parts": [{"text": "Let me look."}, RECALL]}
    assert response == {"role": "user", "parts": [{"functionResponse": {
        "name": "recall", "response": {"output": "the result"}}}]}


def test_a_record_with_text_and_the_recall_keeps_its_text() -> None:
    rnd = GeminiRound()
    out = rnd.feed(frame(record([{"text": "Hm."}, RECALL])))
    assert records(out) == [record([{"text": "Hm."}])]


def test_a_call_id_is_answered_by_id() -> None:
    call = {"functionCall": {"id": "c-7", "name": "recall", "args": {"query": "x"}}}
    recalls, visible = recall_calls([call, READ])
    assert recalls == [RecallCall("c-7", '{"query":"x"}', 0)] and visible == 1
    _, response = follow_up_pair([call], recalls[0], "r")
    assert response["parts"][0]["functionResponse"]["id"] == "c-7"


def test_the_stream_splices_marker_continuation_and_summed_usage() -> None:
    stream = GeminiRecallStream()
    out = stream.feed(frame(record([{"text": "Checking."}])))
    out += stream.feed(frame(record([RECALL], finish="STOP", usage=USAGE_1)))
    stream.round.close()
    out += stream.close_preamble()
    out += stream.marker_record(MARKER)
    stream.begin_continuation()
    out += stream.feed(frame(record([{"text": "Blue "}])))
    out += stream.feed(frame(record([{"text": "cluster."}], finish="STOP", usage=USAGE_2)))
    stream.round.close()
    out += stream.finish()
    got = records(out)
    texts = [p["text"] for r in got for p in r["candidates"][0]["content"]["parts"]]
    assert texts == ["Checking.", "\n\n" + MARKER + "\n\n", "Blue ", "cluster."]
    finishes = [r["candidates"][0].get("finishReason") for r in got]
    assert finishes == [None, None, None, "STOP"]
    assert got[-1]["usageMetadata"] == {"promptTokenCount": 40, "candidatesTokenCount": 7,
                                        "totalTokenCount": 47}
    assert not any("functionCall" in json.dumps(r) for r in got)


def test_a_recall_alone_leaves_only_the_marker_before_the_continuation() -> None:
    stream = GeminiRecallStream()
    assert stream.feed(frame(record([RECALL], finish="STOP"))) == b""
    stream.round.close()
    assert stream.close_preamble() == b""
    (marker,) = records(stream.marker_record(MARKER))
    assert marker["candidates"][0]["content"]["parts"] == [{"text": MARKER + "\n\n"}]


def test_mixed_keeps_the_visible_call_and_its_finish() -> None:
    stream = GeminiRecallStream()
    assert stream.feed(frame(record([READ, RECALL], finish="STOP"))) == b""
    stream.round.close()
    assert stream.round.visible_tools == 1
    out = stream.marker_record(MARKER) + stream.finish()
    got = records(out)
    assert got[1]["candidates"][0]["content"]["parts"] == [READ]
    assert got[1]["candidates"][0]["finishReason"] == "STOP"


def test_the_upstream_error_record_is_relayed_and_ends_the_round() -> None:
    rnd = GeminiRound()
    error = frame({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}})
    assert rnd.feed(error) == error.raw
    assert rnd.feed(frame(record([{"text": "late"}]))) == b""
    rnd.close()
    assert rnd.error is not None and not rnd.recall_seen


def test_a_stream_cut_before_its_finish_fails() -> None:
    rnd = GeminiRound()
    rnd.feed(frame(record([{"text": "half"}])))
    with pytest.raises(ProtocolError):
        rnd.close()


def test_several_candidates_are_refused() -> None:
    two = record([{"text": "a"}])
    two["candidates"].append({**two["candidates"][0], "index": 1})
    with pytest.raises(ProtocolError):
        GeminiRound().feed(frame(two))


def test_the_keepalive_is_an_empty_record() -> None:
    (event,) = SSEDecoder().feed(KEEPALIVE)
    assert event.data == "{}"
    rnd = GeminiRound()
    assert rnd.feed(event) == KEEPALIVE


def test_usable_and_usage_rules() -> None:
    assert content_usable("STOP", [READ])
    assert not content_usable("MAX_TOKENS", [{"text": "cut"}])
    assert not content_usable("STOP", [{"text": "thinking", "thought": True}])
    assert sum_usage([USAGE_1, {"promptTokenCount": 1, "thoughtsTokenCount": 3}]) == {
        "promptTokenCount": 11, "candidatesTokenCount": 2, "totalTokenCount": 12,
        "thoughtsTokenCount": 3}


def test_the_stream_flag_is_the_urls_method() -> None:
    base = "https://g.example/v1beta/models/gemini-2.5-flash"
    body = {"contents": []}
    assert stream_flag(f"{base}:generateContent?key=k", body, True) == (
        f"{base}:streamGenerateContent?key=k&alt=sse", body)
    assert stream_flag(f"{base}:streamGenerateContent?alt=sse", body, False) == (
        f"{base}:generateContent", body)


def test_recovery_retells_the_last_result_with_the_final_round_text() -> None:
    contents = [{"role": "user", "parts": [{"text": "q"}]},
                *follow_up_pair([RECALL], RecallCall("", "{}", 0), "found it")]
    retold = recovery_contents(contents)
    assert retold[:2] == contents[:2]
    output = retold[2]["parts"][0]["functionResponse"]["response"]["output"]
    assert output.startswith("found it\n\n") and output != "found it"


def test_a_whole_answer_must_have_finished() -> None:
    with pytest.raises(ProtocolError):
        check_response(record([{"text": "x"}]))
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}}
    assert check_response(blocked) is blocked


def test_buffered_delivery_puts_the_marker_where_the_call_was() -> None:
    ctx = SimpleNamespace(body={"contents": [{"role": "user", "parts": [{"text": "q"}]}]})
    adapter = BufferedAdapter(ctx)  # type: ignore[arg-type]
    first = record([{"text": "Looking."}, RECALL], finish="STOP", usage=USAGE_1)
    assert adapter.round(first).recalls == 1
    model, response = adapter.recalled(ExecutedRecall("result", MARKER, "a"))
    assert adapter.messages[-2:] == [model, response]
    last = record([{"text": "Blue."}], finish="STOP", usage=USAGE_2)
    assert adapter.round(last).recalls == 0
    body = adapter.delivered(last, mixed=False)
    parts = body["candidates"][0]["content"]["parts"]
    assert parts == [{"text": "Looking."}, {"text": "\n\n" + MARKER + "\n\n"}, {"text": "Blue."}]
    assert body["usageMetadata"]["promptTokenCount"] == 40
