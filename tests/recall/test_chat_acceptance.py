"""Hidden recall for Chat Completions clients, through the real gateway (issue 5).

A Chat client never sees a ``tool_calls`` delta for recall: the marker arrives as
ordinary ``delta.content`` in the same single envelope as the continuation, with
one finish_reason and one ``[DONE]``. The follow-up's stream flag is the
client's own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from lore_gateway.obs import metrics
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream

KEY = "sk-chat-acceptance-0123456789"
FACT = "The release branch is cut every second Thursday by the on-call engineer."
QUESTION = "when is the release branch cut?"
QUERY = "release branch cut"
TOOLS: Any = [{"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object",
                                        "properties": {"path": {"type": "string"}}}}}]
MARKER = f'📚 Searching all archives for "{QUERY}"…'


def counters() -> tuple[float, float, float]:
    """Recalls run, follow-ups sent, follow-ups failed with a 5xx: chat only."""
    return (metrics.recall_calls_total.labels("chat", "ok")._value.get(),
            metrics.followups_total.labels("chat")._value.get(),
            metrics.followup_failures_total.labels("chat", "follow_up_failed")._value.get())


def client(gw: Any, session: str, scenario: str | None = None) -> openai.OpenAI:
    headers = {"x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0,
                         default_headers=headers)


def stored(gw: Any, session: str) -> list[tuple[str, str, bool]]:
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    return [(m.role, m.content, m.complete) for m in gw.memory.session_messages(None, session)]


def seed(gw: Any) -> None:
    # A tool offered makes it the agent's own turn: a one-shot request without tools
    # is a side channel (knowledge/sidechannel.py), and search never returns those.
    reply = client(gw, "seed").chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": FACT}], tools=TOOLS)
    assert reply.choices[0].message.content
    assert stored(gw, "seed")


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "tools": TOOLS,
            "messages": [{"role": "user", "content": QUESTION}], **extra}


def chunks(raw: bytes) -> tuple[list[dict[str, Any]], int]:
    """The data chunks a Chat client got, and how many ``[DONE]`` frames."""
    out, done = [], 0
    for event in SSEDecoder().feed(raw):
        if not event.has_data:
            continue
        assert event.event is None, "Chat clients get data-only frames"
        if event.data == "[DONE]":
            done += 1
        else:
            out.append(orjson.loads(event.data))
    return out, done


def content(parts: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in parts if c.get("choices"))


def finish_reasons(parts: list[dict[str, Any]]) -> list[str]:
    return [c["choices"][0]["finish_reason"] for c in parts
            if c.get("choices") and c["choices"][0].get("finish_reason")]


async def raw_stream(http: aiohttp.ClientSession, gw: Any, session: str,
                     scenario: str | None = None) -> tuple[int, bytes]:
    headers = {"authorization": "Bearer " + KEY, "x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    body = ask(stream=True, stream_options={"include_usage": True})
    async with http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.read()


# --- the SDK's view ------------------------------------------------------------


def test_sdk_stream_sees_marker_and_continuation_in_one_envelope(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    seed(gw)
    fake_upstream.reset()
    stream = client(gw, "sdk-stream", f"recall:{QUERY}").chat.completions.create(
        **ask(stream=True, stream_options={"include_usage": True}))
    got = list(stream)
    assert len({c.id for c in got}) == 1
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in got)
    assert [c.choices[0].finish_reason for c in got
            if c.choices and c.choices[0].finish_reason] == ["stop"]
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    assert text.startswith(MARKER)
    assert FACT in text.split(MARKER, 1)[1]
    usage = [c.usage for c in got if c.usage is not None]
    assert [u.prompt_tokens for u in usage] == [24]  # both rounds, in one usage chunk
    principal, follow_up = fake_upstream.model_requests
    assert principal.json["stream"] is True and follow_up.json["stream"] is True
    assistant, tool = follow_up.json["messages"][-2:]
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "recall"
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": tool["content"]}
    assert FACT in tool["content"]
    assert any(t["function"]["name"] == "recall" for t in follow_up.json["tools"])


def test_sdk_stream_helper_final_completion(make_gateway: Any,
                                            fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    seed(gw)
    with client(gw, "helper", f"recall:{QUERY}").chat.completions.stream(**ask()) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.role == "assistant"
    assert message.tool_calls in (None, [])
    assert message.content is not None and message.content.startswith(MARKER)
    assert FACT in message.content
    assert final.choices[0].finish_reason == "stop"


async def test_raw_stream_one_done(make_gateway: Any, fake_upstream: FakeUpstream,
                                   http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "raw", f"recall:{QUERY}")
    assert status == 200
    parts, done = chunks(raw)
    assert done == 1 and raw.endswith(b"data: [DONE]\n\n")
    assert finish_reasons(parts) == ["stop"]
    assert b"tool_calls" not in raw and b'"recall"' not in raw
    assert "<!-- lore-recall:" in content(parts)
    roles = [c["choices"][0]["delta"].get("role") for c in parts if c.get("choices")]
    assert [r for r in roles if r] == ["assistant"]


def test_sdk_create_gets_one_message_without_the_call(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    seed(gw)
    fake_upstream.reset()
    raw = client(gw, "sdk-json", f"recall:{QUERY}").chat.completions.with_raw_response.create(
        **ask())
    assert raw.headers["x-lore-recall-invoked"] == "true"
    completion = raw.parse()
    message = completion.choices[0].message
    assert message.tool_calls is None
    assert message.content is not None and message.content.startswith(MARKER)
    assert FACT in message.content
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens == 24
    principal, follow_up = fake_upstream.model_requests
    assert principal.json.get("stream") is None and follow_up.json["stream"] is False


# --- shapes --------------------------------------------------------------------


async def test_recall_between_visible_tools_is_hidden_and_reindexed(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "between", f"recall-between:{QUERY}")
    assert status == 200
    parts, done = chunks(raw)
    assert done == 1
    calls = [tc for c in parts if c.get("choices")
             for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert sorted({tc["index"] for tc in calls}) == [0, 1]
    assert {tc["function"]["name"] for tc in calls if "name" in tc["function"]} == {"read_file"}
    assert MARKER in content(parts)
    assert finish_reasons(parts) == ["tool_calls"]
    assert len(fake_upstream.model_requests) == 1  # mixed: no follow-up


async def test_two_chained_recalls(make_gateway: Any, fake_upstream: FakeUpstream,
                                   http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "call-recall:second look", "recall"])
    status, raw = await raw_stream(http, gw, "chain")
    assert status == 200
    parts, done = chunks(raw)
    assert done == 1 and finish_reasons(parts) == ["stop"]
    text = content(parts)
    assert text.index(MARKER) < text.index('"second look"') < text.index("According to memory")
    assert b"tool_calls" not in raw
    (usage,) = [c["usage"] for c in parts if c.get("usage")]
    assert usage["prompt_tokens"] == 36
    first, second, third = fake_upstream.model_requests
    assert len(third.json["messages"]) == len(first.json["messages"]) + 4
    assert third.json["messages"][:-2] == second.json["messages"]


# --- failures ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_follow_up_failure_recovers_once(make_gateway: Any, fake_upstream: FakeUpstream,
                                         stream: bool) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "status-500", "text:Recovered without recall"])
    c = client(gw, f"recover-{stream}")
    before = counters()
    if stream:
        got = list(c.chat.completions.create(**ask(stream=True)))
        text = "".join(ch.choices[0].delta.content or "" for ch in got if ch.choices)
    else:
        text = c.chat.completions.create(**ask()).choices[0].message.content or ""
    assert text.startswith(MARKER)
    assert text.endswith("Recovered without recall")
    after = counters()
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 2, 1]
    _, failed, recovery = fake_upstream.model_requests
    assert failed.json["messages"][:-1] == recovery.json["messages"][:-1]
    assert FINAL_ROUND_TEXT in recovery.json["messages"][-1]["content"]


def test_follow_up_and_recovery_failure_is_502(make_gateway: Any,
                                               fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "status-500", "status-500"])
    with pytest.raises(openai.InternalServerError) as caught:
        client(gw, "fail-json").chat.completions.create(**ask())
    assert caught.value.status_code == 502
    assert caught.value.body == {"type": "server_error", "message": "Recall continuation failed"}
    assert len(fake_upstream.model_requests) == 3


async def test_stream_follow_up_and_recovery_failure_ends_with_error(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "status-500", "status-500"])
    status, raw = await raw_stream(http, gw, "fail-stream")
    assert status == 200
    parts, done = chunks(raw)
    assert done == 0 and finish_reasons(parts) == []
    assert parts[-1]["error"]["message"] == "Lore could not continue the response after recall"


async def test_client_disconnect_mid_recall_cancels_upstream(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "stall"])
    headers = {"authorization": "Bearer " + KEY, "x-lore-session-id": "gone"}
    async with http.post(gw.url + "/v1/chat/completions", json=ask(stream=True),
                         headers=headers) as resp:
        seen = b""
        while b"Hi " not in seen:  # the stalling continuation has begun
            seen += await resp.content.readany()
        left = time.monotonic()
        resp.close()
    follow_up = fake_upstream.model_requests[1]
    gone = await asyncio.to_thread(follow_up.client_gone.wait, 5)
    assert gone, "the stalled follow-up was not cancelled"
    assert follow_up.client_gone_at is not None and follow_up.client_gone_at - left < 2
    rows = stored(gw, "gone")
    assert rows[0] == ("user", QUESTION, False)
    assert all(not complete for _, _, complete in rows)
    assert not any("[tool_call:recall]" in text for _, text, _ in rows)
