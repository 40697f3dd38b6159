"""Hidden recall for Anthropic Messages clients, through the real gateway (issue 5).

Every test talks to a gateway on loopback whose upstream is the scripted fake,
and checks what a user would notice: what the anthropic SDK (or raw HTTP) got,
what the upstream received, and what was stored.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from lore_gateway.obs import metrics
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import FakeUpstream
from lore_gateway.testing.strict import sign_thinking

KEY = "sk-ant-acceptance-0123456789"
FACT = "The orchid cache bucket keeps nightly artefacts for nine days."
QUESTION = "how long does the orchid cache bucket keep artefacts?"
QUERY = "orchid cache bucket"
TOOLS: Any = [{"name": "read_file", "description": "Read a file.",
               "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
MARKER = f'📚 Searching all archives for "{QUERY}"…'


def counters() -> tuple[float, float, float]:
    """Recalls run, follow-ups sent, follow-ups failed with a 5xx: anthropic only."""
    return (metrics.recall_calls_total.labels("anthropic", "ok")._value.get(),
            metrics.followups_total.labels("anthropic")._value.get(),
            metrics.followup_failures_total.labels("anthropic", "follow_up_failed")._value.get())


def client(gw: Any, session: str, scenario: str | None = None) -> anthropic.Anthropic:
    headers = {"x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    return anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0,
                               default_headers=headers)


def seed(gw: Any) -> None:
    """Run one ordinary turn that states the fact, and wait until it is stored."""
    # A tool offered makes it the agent's own turn: a one-shot request without tools
    # is a side channel (knowledge/sidechannel.py), and search never returns those.
    reply = client(gw, "seed").messages.create(
        model="claude-x", max_tokens=64, messages=[{"role": "user", "content": FACT}],
        tools=TOOLS)
    assert reply.content
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session="seed") == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)


def stored(gw: Any, session: str) -> list[tuple[str, str, bool]]:
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    return [(m.role, m.content, m.complete) for m in gw.memory.session_messages(None, session)]


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 256, "tools": TOOLS,
            "messages": [{"role": "user", "content": QUESTION}], **extra}


def envelopes(raw: bytes) -> list[list[dict[str, Any]]]:
    """The client's stream cut into messages: the events from each message_start
    to its message_stop (pings and comments left out)."""
    out: list[list[dict[str, Any]]] = []
    for event in SSEDecoder().feed(raw):
        if not event.has_data or event.name == "ping":
            continue
        payload = orjson.loads(event.data)
        if payload["type"] == "message_start":
            out.append([])
        assert out, f"{payload['type']} outside a message"
        out[-1].append(payload)
    return out


def texts(envelope: list[dict[str, Any]]) -> str:
    return "".join(e["delta"].get("text", "") for e in envelope
                   if e["type"] == "content_block_delta")


def block_types(envelope: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["index"], e["content_block"]["type"]) for e in envelope
            if e["type"] == "content_block_start"]


async def raw_stream(http: aiohttp.ClientSession, gw: Any, session: str,
                     scenario: str | None = None, **extra: Any) -> tuple[int, bytes]:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
               "x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    async with http.post(gw.url + "/v1/messages", json=ask(stream=True, **extra),
                         headers=headers) as resp:
        return resp.status, await resp.read()


def recall_tool_declared(body: dict[str, Any]) -> bool:
    return any(t.get("name") == "recall" for t in body["tools"])


# --- the SDK's view ------------------------------------------------------------


def test_sdk_stream_sees_three_envelopes_and_the_recalled_fact(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    seed(gw)
    fake_upstream.reset()
    with client(gw, "sdk-stream", f"recall:{QUERY}").messages.stream(**ask()) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds.count("message_start") == 3
    assert kinds.count("message_stop") == 3
    starts = [e for e in events if e.type == "content_block_start"]
    assert all(e.content_block.type == "text" for e in starts)  # no tool_use at all
    deltas = [e for e in events if e.type == "message_delta"]
    assert [d.delta.stop_reason for d in deltas] == ["end_turn", "end_turn", "end_turn"]
    # Usage of both upstream rounds (12 input tokens each from the fake).
    assert deltas[-1].usage.input_tokens == 24
    text = "".join(e.delta.text for e in events
                   if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert MARKER in text
    assert FACT in text.split(MARKER, 1)[1]

    principal, follow_up = fake_upstream.model_requests
    assert principal.json["stream"] is True and follow_up.json["stream"] is True
    assert recall_tool_declared(follow_up.json)
    assistant, result = follow_up.json["messages"][-2:]
    assert [b["type"] for b in assistant["content"]] == ["text", "tool_use"]
    assert assistant["content"][1]["name"] == "recall"
    assert result["content"][0]["tool_use_id"] == assistant["content"][1]["id"]
    assert FACT in result["content"][0]["content"]


async def test_raw_stream_marker_is_its_own_message(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "raw", f"recall:{QUERY}")
    assert status == 200
    preamble, marker, continuation = envelopes(raw)
    assert texts(preamble) == "Let me check."
    assert texts(marker).startswith(MARKER)
    assert "<!-- lore-recall:" in texts(marker)
    assert marker[0]["message"]["id"].startswith("lore_marker_")
    assert texts(continuation).startswith("According to memory")
    for envelope in (preamble, marker, continuation):
        assert [e["type"] for e in envelope].count("message_stop") == 1
        assert envelope[-1]["type"] == "message_stop"
    assert b"tool_use" not in raw


def test_sdk_create_gets_one_message_without_the_call(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    seed(gw)
    fake_upstream.reset()
    raw = client(gw, "sdk-json", f"recall:{QUERY}").messages.with_raw_response.create(**ask())
    assert raw.headers["x-lore-recall-invoked"] == "true"
    message = raw.parse()
    assert [b.type for b in message.content] == ["text", "text", "text"]
    lead, marker, answer = (b.text for b in message.content)  # type: ignore[union-attr]
    assert lead == "Let me check."
    assert marker.startswith(MARKER)
    assert FACT in answer
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 24
    principal, follow_up = fake_upstream.model_requests
    assert principal.json.get("stream") is None and follow_up.json["stream"] is False


# --- block positions -----------------------------------------------------------


async def test_recall_as_the_first_block(make_gateway: Any, fake_upstream: FakeUpstream,
                                         http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "first", f"recall-first:{QUERY}")
    assert status == 200
    preamble, marker, continuation = envelopes(raw)
    assert block_types(preamble) == []
    assert block_types(marker) == [(0, "text")]
    assert block_types(continuation) == [(0, "text")]
    assert b"tool_use" not in raw
    assistant = fake_upstream.model_requests[1].json["messages"][-2]
    assert [b["type"] for b in assistant["content"]] == ["tool_use"]


async def test_recall_between_visible_tools_is_hidden_and_reindexed(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "between", f"recall-between:{QUERY}")
    assert status == 200
    (message,) = envelopes(raw)  # mixed: the client runs its tools, no follow-up
    assert block_types(message) == [(0, "text"), (1, "tool_use"), (2, "tool_use"), (3, "text")]
    names = [e["content_block"].get("name") for e in message
             if e["type"] == "content_block_start"]
    assert "recall" not in names
    indices = {e["index"] for e in message if "index" in e}
    assert indices == {0, 1, 2, 3}
    assert MARKER in texts(message)
    (delta,) = [e for e in message if e["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert len(fake_upstream.model_requests) == 1


async def test_thinking_text_recall_replays_signed_thinking(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    status, raw = await raw_stream(http, gw, "thinking", f"thinking-recall:{QUERY}",
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    assert status == 200
    preamble, _, continuation = envelopes(raw)
    assert block_types(preamble) == [(0, "thinking"), (1, "text")]
    signature = "".join(e["delta"].get("signature", "") for e in preamble
                        if e["type"] == "content_block_delta")
    assert signature == sign_thinking("The user wants a stored fact.")  # the fake's own
    assert texts(continuation).startswith("According to memory")

    follow_up = fake_upstream.model_requests[1]
    assert follow_up.json["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert recall_tool_declared(follow_up.json)
    assistant = follow_up.json["messages"][-2]
    thinking, text, call = assistant["content"]
    assert thinking == {"type": "thinking", "thinking": "The user wants a stored fact.",
                        "signature": signature}
    assert text == {"type": "text", "text": "Let me look that up."}
    assert call["type"] == "tool_use" and call["name"] == "recall"
    assert call["input"] == {"query": QUERY}


async def test_two_chained_recalls(make_gateway: Any, fake_upstream: FakeUpstream,
                                   http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "call-recall:second look", "recall"])
    status, raw = await raw_stream(http, gw, "chain")
    assert status == 200
    shapes = envelopes(raw)
    assert len(shapes) == 5  # preamble, marker, continuation, marker, continuation
    assert texts(shapes[1]).startswith(MARKER)
    assert texts(shapes[3]).startswith('📚 Searching all archives for "second look"')
    assert texts(shapes[4]).startswith("According to memory")
    assert b"tool_use" not in raw
    final_delta = [e for e in shapes[4] if e["type"] == "message_delta"][-1]
    assert final_delta["usage"]["input_tokens"] == 36  # three rounds of 12
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
        with c.messages.stream(**ask()) as s:
            text = "".join(s.text_stream)
    else:
        text = "".join(b.text for b in c.messages.create(**ask()).content  # type: ignore
                       if b.type == "text")
    assert MARKER in text
    assert text.endswith("Recovered without recall")
    after = counters()
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 2, 1]
    _, failed, recovery = fake_upstream.model_requests
    assert failed.json["messages"][:-1] == recovery.json["messages"][:-1]
    assert FINAL_ROUND_TEXT in recovery.json["messages"][-1]["content"][0]["content"]


def test_follow_up_and_recovery_failure_is_502(make_gateway: Any,
                                               fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "status-500", "status-500"])
    with pytest.raises(anthropic.InternalServerError) as caught:
        client(gw, "fail-json").messages.create(**ask())
    assert caught.value.status_code == 502
    assert caught.value.body == {"type": "error", "error": {
        "type": "server_error", "message": "Recall continuation failed"}}
    assert len(fake_upstream.model_requests) == 3
    assert all(role != "assistant" or "[tool_call:recall]" not in text
               for role, text, _ in stored(gw, "fail-json"))


async def test_stream_follow_up_and_recovery_failure_ends_with_error(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "status-500", "status-500"])
    status, raw = await raw_stream(http, gw, "fail-stream")
    assert status == 200
    events = [e for e in SSEDecoder().feed(raw) if e.has_data]
    assert events[-1].name == "error"
    assert "could not continue the response after recall" in events[-1].data
    assert [e.name for e in events].count("message_stop") == 2  # preamble and marker only
    assert len(fake_upstream.model_requests) == 3


async def test_client_disconnect_mid_recall_cancels_upstream(
        make_gateway: Any, fake_upstream: FakeUpstream, http: aiohttp.ClientSession) -> None:
    gw = make_gateway()
    fake_upstream.script([f"recall:{QUERY}", "stall"])
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01",
               "x-lore-session-id": "gone"}
    async with http.post(gw.url + "/v1/messages", json=ask(stream=True),
                         headers=headers) as resp:
        seen = b""
        # Preamble and marker delivered, the stalling continuation has begun.
        while seen.count(b"event: message_start") < 3:
            seen += await resp.content.readany()
        assert seen.count(b"event: message_stop") == 2
        left = time.monotonic()
        resp.close()
    follow_up = fake_upstream.model_requests[1]
    # Wait off this loop: it still has to close our socket.
    gone = await asyncio.to_thread(follow_up.client_gone.wait, 5)
    assert gone, "the stalled follow-up was not cancelled"
    assert follow_up.client_gone_at is not None and follow_up.client_gone_at - left < 2
    rows = stored(gw, "gone")
    assert rows[0] == ("user", QUESTION, False)
    assert all(not complete for _, _, complete in rows)
    assert not any("[tool_call:recall]" in text for _, text, _ in rows)
