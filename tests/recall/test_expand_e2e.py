"""Marker and expand through the real gateway and the fake upstream (lore-spec B.6).

Each test runs one turn in which the fake model calls recall, builds the next
request the way the client would (echoing what it received), and checks what the
upstream got: the exact pair the follow-up sent, byte for byte, where the client
had only the marker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import apsw
import openai
import orjson
import pytest

from lore_gateway.sse import SSEDecoder
from lore_gateway.storage import db
from lore_gateway.testing import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    BackgroundServer,
    FakeUpstream,
    gateway_settings,
)

RECALL = "recall:deploy key vault"
FACT_TOOLS = [{"type": "function", "name": "exec",
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
ANTHROPIC_TOOLS = [{"name": "exec", "description": "run a command",
                    "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {
    "name": "exec", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]
U1 = "Where is the deploy key?"
U2 = "Thanks. And who rotates it?"


def headers(session: str, scenario: str | None = None) -> dict[str, str]:
    out = {"x-lore-session-id": session, "x-lore-project": "/work/expand"}
    if scenario is not None:
        out["x-fake-scenario"] = scenario
    return out


def wait_anchors(gw: Any, count: int) -> None:
    """Wait until ``count`` recalls are in the database (written after delivery)."""
    deadline = time.monotonic() + 10
    seen = -1
    while time.monotonic() < deadline:
        conn = db.connect(gw.settings.database, readonly=True)
        try:
            row = conn.execute("SELECT count(*) FROM recall_anchors").fetchone()
        except apsw.SQLError:
            row = (0,)
        finally:
            conn.close()
        seen = int(row[0]) if row else 0
        if seen >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{seen} recalls stored, expected {count}")


def pair_bytes(items: list[Any]) -> bytes:
    """Two JSON values as they appear inside the gateway's compact array."""
    return orjson.dumps(items)[1:-1]


def sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    decoder = SSEDecoder()
    frames = decoder.feed(data) + decoder.close()
    return [(e.name, json.loads(e.data)) for e in frames if e.has_data and e.data != "[DONE]"]


# --- Responses -------------------------------------------------------------------------


def _openai(gw: Any, session: str, scenario: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=OPENAI_KEY, max_retries=0,
                         default_headers=headers(session, scenario))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_responses_next_turn_carries_the_follow_up_pair_byte_identical(
        make_gateway: Any, fake_upstream: FakeUpstream, stream: bool) -> None:
    gw = make_gateway()
    first_input = [{"type": "message", "role": "user", "content": U1}]
    sdk = _openai(gw, "exp-resp", RECALL)
    if stream:
        with sdk.responses.stream(model="gpt-fake", input=first_input,  # type: ignore[arg-type]
                                  tools=FACT_TOOLS) as s:  # type: ignore[arg-type]
            for _ in s:
                pass
            final = s.get_final_response()
    else:
        final = sdk.responses.create(model="gpt-fake", input=first_input,  # type: ignore[arg-type]
                                     tools=FACT_TOOLS)  # type: ignore[arg-type]
    assert final.output_text.startswith("<!-- lore-recall:")
    _, follow = fake_upstream.model_requests
    appended = follow.json["input"][len(first_input):]
    assert [i["type"] for i in appended] == ["function_call", "function_call_output"]
    wait_anchors(gw, 1)
    fake_upstream.reset()

    echoed = [o.model_dump(exclude_none=True) for o in final.output]
    second_input = [*first_input, *echoed, {"type": "message", "role": "user", "content": U2}]
    _openai(gw, "exp-resp").responses.create(model="gpt-fake", input=second_input,  # type: ignore[arg-type]
                                             tools=FACT_TOOLS)  # type: ignore[arg-type]
    (nxt,) = fake_upstream.model_requests
    assert b"lore-recall" not in nxt.body
    # The pair, byte for byte as the follow-up sent it, and at the same place:
    # the follow-up's input is a byte prefix of the next request's input.
    assert pair_bytes(appended) in follow.body
    assert pair_bytes(appended) in nxt.body
    assert orjson.dumps(nxt.json["input"]).startswith(orjson.dumps(follow.json["input"])[:-1])
    assert nxt.json["input"][3:] == [echoed[1], second_input[-1]]


@pytest.mark.usefixtures("database_url")
def test_responses_store_survives_a_restart(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    from lore_gateway.server import Gateway

    settings = gateway_settings(fake_upstream, tmp_path / "data")
    runner = BackgroundServer(Gateway(settings), name="gw-before-restart")
    gw = runner.start()
    try:
        final = _openai(gw, "exp-restart", RECALL).responses.create(
            model="gpt-fake", input=U1, tools=FACT_TOOLS)  # type: ignore[arg-type]
        wait_anchors(gw, 1)
    finally:
        runner.stop()
    follow = fake_upstream.model_requests[1]
    fake_upstream.reset()
    runner = BackgroundServer(Gateway(settings), name="gw-after-restart")
    gw = runner.start()
    try:
        second = [{"role": "user", "content": U1},
                  *[o.model_dump(exclude_none=True) for o in final.output],
                  {"role": "user", "content": U2}]
        _openai(gw, "exp-restart").responses.create(model="gpt-fake", input=second,  # type: ignore[arg-type]
                                                    tools=FACT_TOOLS)  # type: ignore[arg-type]
    finally:
        runner.stop()
    (nxt,) = fake_upstream.model_requests
    assert b"lore-recall" not in nxt.body
    assert pair_bytes(follow.json["input"][-2:]) in nxt.body


def test_foreign_anchor_is_left_alone(make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    final = _openai(gw, "exp-home", RECALL).responses.create(
        model="gpt-fake", input=U1, tools=FACT_TOOLS)  # type: ignore[arg-type]
    wait_anchors(gw, 1)
    echoed = [o.model_dump(exclude_none=True) for o in final.output]
    anchor = final.output_text.split("-->")[0] + "-->"
    fake_upstream.reset()
    # Another session, and the same session in another conversation: both keep the text.
    for session, first in (("exp-elsewhere", U1), ("exp-home", "A different question")):
        _openai(gw, session).responses.create(
            model="gpt-fake", tools=FACT_TOOLS,  # type: ignore[arg-type]
            input=[{"role": "user", "content": first}, *echoed,  # type: ignore[list-item]
                   {"role": "user", "content": U2}])
    for request in fake_upstream.model_requests:
        assert anchor.encode() in request.body
        assert b'"function_call_output"' not in request.body


def test_markers_never_reach_stored_text_or_search(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    sdk = _openai(gw, "exp-clean", RECALL)
    final = sdk.responses.create(model="gpt-fake", input=U1, tools=FACT_TOOLS)  # type: ignore[arg-type]
    msgs = anthropic.Anthropic(base_url=gw.url, api_key=ANTHROPIC_KEY, max_retries=0,
                               default_headers=headers("exp-clean-a", RECALL))
    msgs.messages.create(model="claude-fake", max_tokens=100, tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
                         messages=[{"role": "user", "content": U1}])
    second = [{"role": "user", "content": U1},
              *[o.model_dump(exclude_none=True) for o in final.output],
              {"role": "user", "content": U2}]
    wait_anchors(gw, 2)
    _openai(gw, "exp-clean").responses.create(model="gpt-fake", input=second,  # type: ignore[arg-type]
                                              tools=FACT_TOOLS)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while (gw.memory.count_turns(None, session="exp-clean") < 2
           or gw.memory.count_turns(None, session="exp-clean-a") < 1) \
            and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.02)
    gw.memory.flush(timeout=10)
    stored = [m.content for s in ("exp-clean", "exp-clean-a")
              for m in gw.memory.session_messages(None, s)]
    assert stored and any("According to memory" in t for t in stored)
    assert not any("lore-recall" in t or "📚" in t for t in stored)
    identity = gw.memory.identify("responses", headers("exp-clean") | {
        "authorization": f"Bearer {OPENAI_KEY}"}, {"input": U1})
    for query in ("lore-recall", "Searching all archives", "deploy key"):
        rendered = gw.memory.render(gw.memory.search_sync(query, identity=identity))
        assert "lore-recall" not in rendered and "📚" not in rendered


# --- Anthropic -------------------------------------------------------------------------


def _envelopes(data: bytes) -> list[dict[str, Any]]:
    """The assistant messages a streaming Anthropic client assembles, one per envelope."""
    messages: list[dict[str, Any]] = []
    for name, event in sse(data):
        if name == "message_start":
            messages.append({"role": "assistant", "content": []})
        elif name == "content_block_start":
            messages[-1]["content"].append(dict(event["content_block"]))
        elif name == "content_block_delta" and event["delta"]["type"] == "text_delta":
            messages[-1]["content"][-1]["text"] += event["delta"]["text"]
    return messages


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_anthropic_next_turn_carries_the_follow_up_pair_byte_identical(
        make_gateway: Any, fake_upstream: FakeUpstream, http: Any, stream: bool) -> None:
    gw = make_gateway()
    auth = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    first = [{"role": "user", "content": U1}]
    body = {"model": "claude-fake", "max_tokens": 100, "tools": ANTHROPIC_TOOLS,
            "messages": first, "stream": stream}
    async with http.post(gw.url + "/v1/messages", json=body,
                         headers=auth | headers("exp-anth", RECALL)) as resp:
        raw = await resp.read()
    if stream:
        received = _envelopes(raw)
        assert len(received) == 3  # preamble, marker, continuation
    else:
        received = [{"role": "assistant", "content": json.loads(raw)["content"]}]
    _, follow = fake_upstream.model_requests
    appended = follow.json["messages"][len(first):]
    assert appended[0]["content"][-1]["name"] == "recall"
    wait_anchors(gw, 1)
    fake_upstream.reset()

    second = [*first, *received, {"role": "user", "content": U2}]
    async with http.post(gw.url + "/v1/messages", headers=auth | headers("exp-anth"),
                         json={**body, "messages": second, "stream": False}) as resp:
        assert resp.status == 200
    (nxt,) = fake_upstream.model_requests
    assert b"lore-recall" not in nxt.body
    assert pair_bytes(appended) in follow.body and pair_bytes(appended) in nxt.body
    assert orjson.dumps(nxt.json["messages"]).startswith(
        orjson.dumps(follow.json["messages"])[:-1])
    assert nxt.json["messages"][-1] == second[-1]
    assert nxt.body.count(b"cache_control") == 0


# --- Chat Completions ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_chat_next_turn_carries_the_follow_up_pair_byte_identical(
        make_gateway: Any, fake_upstream: FakeUpstream, stream: bool) -> None:
    gw = make_gateway()
    sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key=OPENAI_KEY, max_retries=0,
                        default_headers=headers("exp-chat", RECALL))
    first = [{"role": "user", "content": U1}]
    if stream:
        chunks = sdk.chat.completions.create(model="gpt-fake", messages=first,  # type: ignore[arg-type]
                                             tools=CHAT_TOOLS, stream=True)  # type: ignore[arg-type]
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        done = sdk.chat.completions.create(model="gpt-fake", messages=first,  # type: ignore[arg-type]
                                           tools=CHAT_TOOLS)  # type: ignore[arg-type]
        content = done.choices[0].message.content or ""
    assert "<!-- lore-recall:" in content and "According to memory" in content
    _, follow = fake_upstream.model_requests
    appended = follow.json["messages"][len(first):]
    assert appended[0]["tool_calls"][0]["function"]["name"] == "recall"
    wait_anchors(gw, 1)
    fake_upstream.reset()

    second = [*first, {"role": "assistant", "content": content}, {"role": "user", "content": U2}]
    plain = openai.OpenAI(base_url=gw.url + "/v1", api_key=OPENAI_KEY, max_retries=0,
                          default_headers=headers("exp-chat"))
    plain.chat.completions.create(model="gpt-fake", messages=second,  # type: ignore[arg-type]
                                  tools=CHAT_TOOLS)  # type: ignore[arg-type]
    (nxt,) = fake_upstream.model_requests
    assert b"lore-recall" not in nxt.body
    assert pair_bytes(appended) in follow.body and pair_bytes(appended) in nxt.body
    tail = nxt.json["messages"][len(first) + 2:]
    assert tail[0] == {"role": "assistant", "content": content.split("-->\n\n", 1)[1]}
    assert tail[1] == second[-1]
