"""Issue 4 invariants and failure semantics, through the real gateway and the fake:
stream flag ↔ consumer, stored turn, private coverage, empty-completion telemetry,
recovery, the final failure, client abort."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from responses_rig import (
    FACT,
    KEY,
    TOOLS,
    private_coverage_marks,
    seed_fact,
    sse_events,
    wait_stored,
)

from lore_gateway.recall.core import telemetry
from lore_gateway.testing import FakeUpstream

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
SSE_ANSWER = FIXTURES / "codex/served-streams/text_full_accepted.sse"
JSON_ANSWER = (FIXTURES / "openai-responses"
               / "reasoning_summary_encrypted_3_function_calls.nonstream.json")
# A whole answer with no output at all (lore-spec F.1: an empty content list is empty).
EMPTY_STREAM = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
    b'"response":{"id":"resp_empty","object":"response","created_at":1,"status":"in_progress",'
    b'"model":"gpt-fake","output":[],"usage":null}}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","sequence_number":1,'
    b'"response":{"id":"resp_empty","object":"response","created_at":1,"status":"completed",'
    b'"model":"gpt-fake","output":[],"usage":{"input_tokens":5,"output_tokens":0,'
    b'"total_tokens":5}}}\n\n'
)
RECALL = "recall:staging database password rotation"
FAILED_MESSAGE = "Lore could not continue the response after recall"
RECALL_FAILED_502 = {"type": "error",
                     "error": {"type": "server_error", "message": "Recall continuation failed"}}


def _headers(session: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}", "x-lore-session-id": session,
            "x-lore-project": "/work/acceptance"}


def _body(stream: bool, text: str = "When does the password rotate?") -> dict[str, Any]:
    return {"model": "gpt-fake", "input": text, "stream": stream, "tools": TOOLS}


async def _post(http: aiohttp.ClientSession, gw: Any, session: str, *, stream: bool,
                path: str = "/v1/responses") -> tuple[int, dict[str, str], bytes]:
    async with http.post(gw.url + path, json=_body(stream), headers=_headers(session)) as r:
        return r.status, dict(r.headers), await r.read()


@pytest.fixture
def seeded(gateway: Any, fake_upstream: FakeUpstream) -> Any:
    seed_fact(gateway, "inv-seed")
    fake_upstream.reset()
    return gateway


# --- invariant 1: the follow-up's stream flag and its consumer ----------------------


async def test_json_follow_up_answered_with_sse_fails_then_recovers(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_upstream.script([RECALL, f"replay:{SSE_ANSWER}", "text:Recovered without recall"])
    status, headers, body = await _post(http, seeded, "inv-mismatch-ok", stream=False)
    assert status == 200 and headers["x-lore-recall-invoked"] == "true"
    answer = json.loads(body)
    assert "Recovered without recall" in answer["output"][-1]["content"][0]["text"]
    # Recovered items carry gateway-made ids, never the upstream's.
    assert answer["output"][-1]["id"].startswith("msg_lore_recovery_")
    assert [r.json["stream"] for r in fake_upstream.model_requests[1:]] == [False, False]
    assert "recall follow-up expected JSON but got SSE" in caplog.text


async def test_json_follow_up_answered_with_sse_twice_is_a_502(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.script([RECALL, f"replay:{SSE_ANSWER}", f"replay:{SSE_ANSWER}"])
    status, headers, body = await _post(http, seeded, "inv-mismatch-502", stream=False)
    assert status == 502 and json.loads(body) == RECALL_FAILED_502
    assert "x-lore-recall-invoked" not in headers
    assert len(fake_upstream.model_requests) == 3  # principal, follow-up, one recovery


async def test_codex_sse_follow_up_answered_with_json_fails_with_clear_error(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_upstream.script([RECALL, f"replay:{JSON_ANSWER}", f"replay:{JSON_ANSWER}"])
    status, _, body = await _post(http, seeded, "inv-codex-mismatch", stream=False,
                                  path="/backend-api/codex/responses")
    assert status == 502 and json.loads(body) == RECALL_FAILED_502
    assert 'recall follow-up expected SSE but got "application/json"' in caplog.text
    assert [r.json["stream"] for r in fake_upstream.model_requests] == [True, True, True]


async def test_streaming_client_gets_one_response_failed_when_recovery_fails(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.script([RECALL, "status-500", "status-500"])
    status, _, body = await _post(http, seeded, "inv-stream-fail", stream=True)
    assert status == 200
    events = sse_events(body)
    names = [n for n, _ in events]
    assert names.count("response.created") == 1
    assert names[-1] == "response.failed" and names.count("response.failed") == 1
    assert events[-1][1]["response"]["error"]["message"] == FAILED_MESSAGE
    assert events[-1][1]["response"]["id"] == events[0][1]["response"]["id"]
    # Neither the anchor nor any partial continuation reached the client.
    assert b"lore-recall" not in body and b"According to memory" not in body
    assert len(fake_upstream.model_requests) == 3


async def test_streaming_recovery_delivers_fresh_ids_and_one_terminal(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.script([RECALL, "failed", "text:Recovered stream answer"])
    _, _, body = await _post(http, seeded, "inv-stream-recover", stream=True)
    events = sse_events(body)
    names = [n for n, _ in events]
    assert names[-1] == "response.completed" and names.count("response.completed") == 1
    final = events[-1][1]["response"]
    assert "Recovered stream answer" in final["output"][-1]["content"][0]["text"]
    added = [e["item"]["id"] for n, e in events if n == "response.output_item.added"]
    assert added[-1].startswith("msg_lore_recovery_")
    assert final["output"][-1]["id"] == added[-1]


# --- invariant 2: the stored turn matches the upstream streams ------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_stored_turn_has_recall_call_and_continuation_but_no_anchor(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession, stream: bool
) -> None:
    session = f"inv-stored-{stream}"
    fake_upstream.script([RECALL, RECALL])
    status, _, body = await _post(http, seeded, session, stream=stream)
    assert status == 200 and b"lore-recall" in body  # the client did get the anchor
    await asyncio.to_thread(wait_stored, seeded, session)
    stored = [(m.role, m.content) for m in seeded.memory.session_messages(None, session)]
    follow = fake_upstream.model_requests[1].json["input"]
    call, output = follow[-2], follow[-1]
    assert stored[0] == ("user", "When does the password rotate?")
    assert stored[1] == ("assistant", f"[tool_call:recall] {call['arguments']}")
    answer = _answer_text(body, stream)
    assert answer.startswith("According to memory") and stored[2] == ("assistant", answer)
    assert not any("lore-recall" in text for _, text in stored)
    assert not any(output["output"] in text for _, text in stored)  # results not re-stored


def _answer_text(body: bytes, stream: bool) -> str:
    """The continuation's text as the client received it (the anchor item aside)."""
    response = sse_events(body)[-1][1]["response"] if stream else json.loads(body)
    return str(response["output"][-1]["content"][0]["text"])


# --- invariant 3: recall coverage is private ------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_client_bytes_hold_no_recall_result_or_coverage(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession, stream: bool
) -> None:
    fake_upstream.script([RECALL, "text:Done, the rotation is weekly"])
    status, headers, body = await _post(http, seeded, f"inv-private-{stream}", stream=stream)
    assert status == 200
    seen = body + "\n".join(f"{k}: {v}" for k, v in headers.items()).encode()
    result = fake_upstream.model_requests[1].json["input"][-1]["output"]
    refs = re.findall(r"\((t:[^)\s]+)\)", result)
    assert refs and FACT[:40] in result  # the recall really found the fact
    assert result.encode() not in seen
    for line in result.splitlines():
        if line.strip() and line.strip() != "---":
            assert line.encode() not in seen, line
    for ref in refs:
        assert ref.encode() not in seen
    marks = private_coverage_marks(seeded)
    assert marks  # the fact is stored, so its coverage fingerprint exists
    for mark in marks:
        assert mark not in seen, "private recall coverage reached the client"


# --- invariant 4: empty-completion telemetry -------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_empty_completion_warns_once_and_a_bad_sink_changes_nothing(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture, tmp_path: Path, stream: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="lore.recall")
    release, got = threading.Event(), threading.Event()
    seen: list[telemetry.EmptyCompletion] = []

    def raising(event: telemetry.EmptyCompletion) -> None:
        raise RuntimeError("sink is broken")

    def hanging(event: telemetry.EmptyCompletion) -> None:
        seen.append(event)
        got.set()
        release.wait(30)

    empty = tmp_path / "empty.sse"
    empty.write_bytes(EMPTY_STREAM)
    removers = [telemetry.add_sink(raising), telemetry.add_sink(hanging)]
    headers = {**_headers("inv-empty-session-0123456789"), "x-fake-replay": str(empty)}
    try:
        started = time.monotonic()
        async with http.post(gateway.url + "/backend-api/codex/responses", json=_body(stream),
                             headers=headers) as r:
            status, body = r.status, await r.read()
        elapsed = time.monotonic() - started
        # The hanging sink got the report while the response had long completed.
        await asyncio.to_thread(got.wait, 5)
    finally:
        release.set()
        for remove in removers:
            remove()
    assert status == 200 and elapsed < 5
    assert seen and seen[0].protocol == "codex" and seen[0].output_tokens == 0
    if stream:
        assert body == EMPTY_STREAM  # unchanged by the telemetry
    else:
        assert json.loads(body)["output"] == []
    warnings = [r.getMessage() for r in caplog.records if "empty completion" in r.getMessage()]
    assert len(warnings) == 1
    assert "empty completion → client: protocol=codex model=gpt-fake" in warnings[0]
    assert "outputTokens=0 recallDepth=0 session=inv-empty-sessio" in warnings[0]
    assert "inv-empty-session-0" not in warnings[0]  # the session is truncated


async def test_answer_with_text_is_not_an_empty_completion(
    gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, _, body = await _post(http, gateway, "inv-not-empty", stream=False)
    assert status == 200 and b"Hi from the fake upstream" in body
    assert "empty completion" not in caplog.text


# --- abort -----------------------------------------------------------------------------


async def test_client_abort_during_follow_up_cancels_upstream_and_rolls_back(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = "inv-abort"
    fake_upstream.script([RECALL, "stall"])
    response = await http.post(seeded.url + "/v1/responses", json=_body(True),
                               headers=_headers(session))
    await response.content.readany()  # the principal's first events arrived
    await asyncio.to_thread(_wait_for_requests, fake_upstream, 2)
    follow = fake_upstream.model_requests[1]
    response.close()
    gone = await asyncio.to_thread(follow.client_gone.wait, 5)
    assert gone, "the follow-up was not cancelled when the client left"
    assert len(fake_upstream.model_requests) == 2  # no recovery for an abort
    await asyncio.to_thread(wait_stored, seeded, session)  # the abandoned turn landed
    stored = seeded.memory.session_messages(None, session)
    assert all(not m.complete for m in stored)  # never stored as a complete turn
    assert "recall-aware stream failed" not in caplog.text
    assert "recall continuation failed" not in caplog.text.lower()



def _wait_for_requests(fake: FakeUpstream, count: int) -> None:
    deadline = time.monotonic() + 5
    while len(fake.model_requests) < count and time.monotonic() < deadline:
        time.sleep(0.01)
