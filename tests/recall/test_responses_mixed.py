"""Responses recall through the gateway, the less common shapes: a recall next to a
visible tool call (mixed output), two recalls at once, Codex rate limits across a
recall chain, and recovery that must not repeat what the client already has."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import orjson
import pytest
from responses_rig import KEY, TOOLS, seed_fact, sse_events, wait_stored

from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.responses.live import FollowUp, LiveInterceptor, RunRecall
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_recall import TEXT_RECALL_PREAMBLE

QUERY = "staging database password rotation"
FAILED_MESSAGE = "Lore could not continue the response after recall"
RECALL_FAILED_502 = {"type": "error",
                     "error": {"type": "server_error", "message": "Recall continuation failed"}}
CODEX = "/backend-api/codex/responses"


def _headers(session: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}", "x-lore-session-id": session,
            "x-lore-project": "/work/acceptance"}


async def _post(http: aiohttp.ClientSession, gw: Any, session: str, *, stream: bool,
                path: str = "/v1/responses",
                text: str = "When does the password rotate?") -> tuple[int, dict[str, str], bytes]:
    body = {"model": "gpt-fake", "input": text, "stream": stream, "tools": TOOLS}
    async with http.post(gw.url + path, json=body, headers=_headers(session)) as r:
        return r.status, dict(r.headers), await r.read()


@pytest.fixture
def seeded(gateway: Any, fake_upstream: FakeUpstream) -> Any:
    seed_fact(gateway, "mixed-seed")
    fake_upstream.reset()
    return gateway


def _output(body: bytes, stream: bool) -> list[dict[str, Any]]:
    response = sse_events(body)[-1][1]["response"] if stream else json.loads(body)
    return list(response["output"])


def _anchor_id(item: dict[str, Any]) -> str:
    text = str(item["content"][0]["text"])
    assert text.startswith("<!-- lore-recall:") and text.endswith(" -->"), text
    return text.removeprefix("<!-- lore-recall:").removesuffix(" -->")


# --- mixed output -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_mixed_output_delivers_anchor_and_visible_calls_without_a_follow_up(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession, stream: bool,
) -> None:
    session = f"mixed-{stream}"
    fake_upstream.script([f"recall-between:{QUERY}"])
    status, headers, body = await _post(http, seeded, session, stream=stream)
    assert status == 200
    # One upstream request: the client runs its tools, no follow-up is sent.
    assert len(fake_upstream.model_requests) == 1
    output = _output(body, stream)
    assert [i["type"] for i in output] == ["function_call", "message", "function_call"]
    assert [i.get("name") for i in output] == ["read_file", None, "read_file"]
    anchor = _anchor_id(output[1])
    assert b'"name":"recall"' not in body and b"According to memory" not in body
    if stream:
        events = sse_events(body)
        names = [n for n, _ in events]
        assert names.count("response.created") == 1 and names[-1] == "response.completed"
        indices = sorted({e["output_index"] for n, e in events if "output_index" in e})
        assert indices == [0, 1, 2]
        seqs = [e["sequence_number"] for _, e in events]
        assert seqs == list(range(len(seqs)))
    else:
        assert headers["x-lore-recall-invoked"] == "true"

    # The recall ran and is kept for replay: the next request, which carries the
    # anchor and the client's tool outputs, goes upstream with the exact pair.
    await asyncio.to_thread(wait_stored, seeded, session)
    fake_upstream.reset()
    calls = [i for i in output if i["type"] == "function_call"]
    follow_on = [
        {"role": "user", "content": "When does the password rotate?"},
        *output,
        *({"type": "function_call_output", "call_id": c["call_id"], "output": "# README"}
          for c in calls),
    ]
    async with http.post(seeded.url + "/v1/responses", headers=_headers(session),
                         json={"model": "gpt-fake", "input": follow_on, "stream": False,
                               "tools": TOOLS}) as r:
        assert r.status == 200
    sent = fake_upstream.model_requests[0].json["input"]
    recall_call = next(i for i in sent if i.get("name") == "recall")
    result = next(i for i in sent if i.get("type") == "function_call_output"
                  and i["call_id"] == recall_call["call_id"])
    assert "staging database password rotation" in result["output"].lower()
    assert anchor not in json.dumps(sent)


# --- parallel recalls ---------------------------------------------------------------


async def test_parallel_recalls_fail_the_stream_with_one_response_failed(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
) -> None:
    fake_upstream.script([f"parallel-recall:{QUERY}"])
    status, _, body = await _post(http, seeded, "parallel-stream", stream=True)
    assert status == 200
    events = sse_events(body)
    names = [n for n, _ in events]
    assert names.count("response.created") == 1
    assert names[-1] == "response.failed" and names.count("response.failed") == 1
    assert events[-1][1]["response"]["error"]["message"] == FAILED_MESSAGE
    assert b"recall" not in body.replace(FAILED_MESSAGE.encode(), b"")
    # No recall ran, no follow-up went out.
    assert len(fake_upstream.model_requests) == 1


async def test_parallel_recalls_are_a_502_for_a_json_client(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
) -> None:
    fake_upstream.script([f"parallel-recall:{QUERY}"])
    status, headers, body = await _post(http, seeded, "parallel-json", stream=False)
    assert status == 502 and json.loads(body) == RECALL_FAILED_502
    assert "x-lore-recall-invoked" not in headers
    assert len(fake_upstream.model_requests) == 1


# --- Codex rate limits ----------------------------------------------------------------


def _rate_frames(body: bytes) -> list[bytes]:
    return [f + b"\n\n" for f in body.split(b"\n\n") if f.startswith(b"event: codex.rate_limits")]


async def test_codex_rate_limits_reach_the_client_after_created_across_a_recall(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession,
) -> None:
    fake_upstream.script([f"recall:{QUERY}", f"recall:{QUERY}"])
    fake_upstream.script_rate_limits([12, 30])
    status, _, body = await _post(http, seeded, "rl-stream", stream=True, path=CODEX)
    assert status == 200
    assert len(fake_upstream.model_requests) == 2
    assert body.startswith(b"event: response.created\n")
    # Both frames reach the client byte for byte, the principal's first, and none
    # before response.created.
    assert _rate_frames(body) == [fs.codex_rate_limits_frame(12), fs.codex_rate_limits_frame(30)]
    assert body.index(fs.codex_rate_limits_frame(12)) < body.index(b"lore-recall:")
    names = [n for n, _ in sse_events(body)]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    # They stay outside the contiguous sequence.
    seqs = [e["sequence_number"] for n, e in sse_events(body) if n != "codex.rate_limits"]
    assert seqs == list(range(len(seqs)))


def _feed(icpt: LiveInterceptor, frames: tuple[bytes, ...]) -> list[Any]:
    decoder = SSEDecoder()
    actions = [a for e in [*decoder.feed(b"".join(frames)), *decoder.close()]
               for a in icpt.feed(e)]
    return actions + icpt.end_of_stream()


def test_rate_limits_are_kept_in_order_without_consecutive_duplicates() -> None:
    """The accumulated log: the principal's first, then each continuation's, a
    repeat of the previous one dropped, a changed bucket kept."""
    icpt = LiveInterceptor(budget=RecallChainBudget(), codex=True)
    recall = fs.responses_call("recall", orjson.dumps({"query": QUERY}).decode(), "gpt-fake")
    actions = _feed(icpt, (fs.codex_rate_limits_frame(12), *recall.frames))
    assert isinstance(actions[-1], RunRecall)
    assert isinstance(icpt.recall_done("- (user, 1m ago) fact (t:1)", "a" * 8)[-1], FollowUp)
    icpt.begin_continuation()
    again = fs.responses_call("recall", orjson.dumps({"query": "other"}).decode(), "gpt-fake")
    _feed(icpt, (fs.codex_rate_limits_frame(12), *again.frames))
    icpt.recall_done("- (user, 1m ago) fact (t:1)", "b" * 8)
    icpt.begin_continuation()
    text = fs.responses_text("done", "gpt-fake")
    _feed(icpt, (fs.codex_rate_limits_frame(30), fs.codex_rate_limits_frame(30), *text.frames))
    percents = [e["rate_limits"]["primary"]["used_percent"] for e in icpt.rate_limits.events]
    assert percents == [12, 30]


# --- recovery never repeats what the client already has ------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_recovery_that_repeats_delivered_text_is_refused(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession, stream: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The principal said "Let me look that up." (live, before the recall); the
    continuation fails, and the recovery starts by saying it again: refused."""
    repeat = f"text:  Let me look   that up. {QUERY} is weekly."
    fake_upstream.script([f"text-recall:{QUERY}", "failed", repeat])
    status, _, body = await _post(http, seeded, f"recover-repeat-{stream}", stream=stream)
    assert len(fake_upstream.model_requests) == 3
    assert "upstream recovery output repeated delivered text" in caplog.text
    if stream:
        events = sse_events(body)
        names = [n for n, _ in events]
        assert names[-1] == "response.failed" and names.count("response.failed") == 1
        assert events[-1][1]["response"]["error"]["message"] == FAILED_MESSAGE
        # Its delta, text done and item done, sent live once; never repeated.
        assert body.count(TEXT_RECALL_PREAMBLE.encode()) == 3
        assert b"is weekly" not in body
    else:
        assert status == 502 and json.loads(body) == RECALL_FAILED_502


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_recovery_with_new_text_follows_the_delivered_preamble(
    seeded: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession, stream: bool,
) -> None:
    fake_upstream.script([f"text-recall:{QUERY}", "failed", "text:It rotates weekly."])
    status, _, body = await _post(http, seeded, f"recover-new-{stream}", stream=stream)
    assert status == 200
    texts = [i["content"][0]["text"] for i in _output(body, stream) if i["type"] == "message"]
    assert texts[0] == TEXT_RECALL_PREAMBLE and texts[-1] == "It rotates weekly."
    assert texts[1].startswith("<!-- lore-recall:")
