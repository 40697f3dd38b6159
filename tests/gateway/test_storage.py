"""Every turn through the gateway is stored exactly once, streamed or not, per protocol."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import openai
import pytest

from lore_gateway import channel
from lore_gateway.testing import FakeUpstream

KEY = "sk-storage-test-0123456789"


def stored(gw: Any, session: str) -> list[tuple[str, str, bool]]:
    """The session's stored messages, once its turn is written.

    The gateway hands a turn to memory after the client got the whole response,
    so the test may get here first: wait for the turn, then for the writer.
    """
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    return [(m.role, m.content, m.complete) for m in gw.memory.session_messages(None, session)]


def client(gw: Any, session: str, path: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + path, api_key=KEY, max_retries=0,
                         default_headers={"x-lore-session-id": session})


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_responses_turn_stored_once(make_gateway: Any, fake_upstream: FakeUpstream,
                                    stream: bool) -> None:
    gw = make_gateway()
    session = f"responses-{stream}"
    c = client(gw, session)
    if stream:
        with c.responses.stream(model="gpt-x", input="where is the config loader?") as s:
            text = s.get_final_response().output_text
    else:
        text = c.responses.create(model="gpt-x", input="where is the config loader?").output_text
    assert text
    rows = stored(gw, session)
    assert rows[0] == ("user", "where is the config loader?", True)
    assert [r[0] for r in rows[1:]] == ["assistant"]
    assert rows[1][1] == text
    assert gw.memory.count_turns(None, session=session) == 1


@pytest.mark.parametrize("path", ["/v1", "/backend-api/codex"])
def test_a_recall_watched_answer_is_stored_once(make_gateway: Any, fake_upstream: FakeUpstream,
                                                path: str) -> None:
    """The client offers a tool, so the gateway injects recall and watches the
    stream; an answer that calls nothing is relayed untouched, and stored from
    its terminal (recall/responses/gate.py)."""
    gw = make_gateway()
    session = f"watched-{path.count('/')}"
    tool = {"type": "function", "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
    with client(gw, session, path).responses.stream(
            model="gpt-x", input="where is the config loader?", tools=[tool]) as s:
        text = s.get_final_response().output_text
    assert text
    names = [t.get("name") for t in fake_upstream.model_requests[0].json["tools"]]
    assert names == ["read_file", "recall"]
    assert stored(gw, session) == [("user", "where is the config loader?", True),
                                   ("assistant", text, True)]
    assert gw.memory.count_turns(None, session=session) == 1


def test_codex_stream_false_answered_as_json_and_stored(make_gateway: Any,
                                                        fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    c = client(gw, "codex-json", "/backend-api/codex")
    resp = c.responses.create(model="gpt-x", input="hello codex", max_output_tokens=50,
                              store=True)
    assert resp.output_text
    (upstream,) = fake_upstream.model_requests
    assert upstream.json["stream"] is True
    assert upstream.json["store"] is False
    assert "max_output_tokens" not in upstream.json
    rows = stored(gw, "codex-json")
    assert rows == [("user", "hello codex", True), ("assistant", resp.output_text, True)]


def test_upstream_failure_stores_input_as_incomplete(make_gateway: Any,
                                                     fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    c = client(gw, "failing")
    with pytest.raises(openai.InternalServerError):
        c.with_options(default_headers={"x-lore-session-id": "failing",
                                        "x-fake-scenario": "status-500"}).responses.create(
            model="gpt-x", input="this request fails")
    assert stored(gw, "failing") == [("user", "this request fails", False)]


def test_untouched_request_forwarded_as_original_bytes(make_gateway: Any,
                                                      fake_upstream: FakeUpstream) -> None:
    import urllib.request

    gw = make_gateway()
    body = b'{"model": "gpt-x",   "input": "spacing \\u00e9 kept", "stream": true}'
    request = urllib.request.Request(
        gw.url + "/v1/responses", data=body, method="POST",
        headers={"content-type": "application/json", "authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
        r.read()
    (upstream,) = fake_upstream.model_requests
    assert upstream.body == body
    assert upstream.headers["authorization"] == "Bearer " + KEY


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_chat_turn_stored_once(make_gateway: Any, fake_upstream: FakeUpstream,
                               stream: bool) -> None:
    gw = make_gateway()
    session = f"chat-{stream}"
    c = client(gw, session)
    messages: Any = [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "which port does the gateway use?"}]
    if stream:
        chunks = list(c.chat.completions.create(model="gpt-x", messages=messages, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    else:
        reply = c.chat.completions.create(model="gpt-x", messages=messages)
        text = reply.choices[0].message.content
    assert text
    assert stored(gw, session) == [("user", "which port does the gateway use?", True),
                                   ("assistant", text, True)]
    assert gw.memory.count_turns(None, session=session) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_anthropic_turn_stored_once(make_gateway: Any, fake_upstream: FakeUpstream,
                                    stream: bool) -> None:
    import anthropic

    gw = make_gateway()
    session = f"anthropic-{stream}"
    c = anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0,
                            default_headers={"x-lore-session-id": session})
    messages: Any = [{"role": "user", "content": "what did we decide about retries?"}]
    if stream:
        with c.messages.stream(model="claude-x", max_tokens=100, messages=messages) as s:
            message = s.get_final_message()
    else:
        message = c.messages.create(model="claude-x", max_tokens=100, messages=messages)
    text = "".join(b.text for b in message.content if b.type == "text")
    assert text
    assert stored(gw, session) == [("user", "what did we decide about retries?", True),
                                   ("assistant", text, True)]
    assert gw.memory.count_turns(None, session=session) == 1


LINGERED = {  # a request of each protocol, and the last frame of its answer
    "responses": ("/v1/responses", {"model": "gpt-x", "input": "where is the loader?"},
                  b"response.completed"),
    "chat": ("/v1/chat/completions", {"model": "gpt-x", "messages": [
        {"role": "user", "content": "where is the loader?"}]}, b"[DONE]"),
    "anthropic": ("/v1/messages", {"model": "claude-x", "max_tokens": 64, "messages": [
        {"role": "user", "content": "where is the loader?"}]}, b"message_stop"),
}
TOOL = {"responses": {"type": "function", "name": "read_file", "parameters": {}},
        "chat": {"type": "function", "function": {"name": "read_file", "parameters": {}}},
        "anthropic": {"name": "read_file", "input_schema": {"type": "object"}}}


@pytest.mark.parametrize("tools", [False, True], ids=["relayed", "recall-watched"])
@pytest.mark.parametrize("protocol", list(LINGERED))
async def test_a_client_that_leaves_after_the_terminal_event_leaves_a_complete_turn(
        make_gateway: Any, fake_upstream: FakeUpstream, protocol: str, tools: bool) -> None:
    """Codex exits as soon as it reads ``response.completed``; the provider's end
    of body may come later. The answer was whole, so the turn is stored whole.

    Except on an Anthropic stream watched for recall: the gateway's recall stream
    there holds three messages, so a ``message_stop`` is not known to be the end,
    and the turn is cut as for any client that leaves early."""
    gw = make_gateway()
    session = f"linger-{protocol}-{tools}"
    await leave_at_the_terminal(gw, protocol, session, "linger:0.3", tools=tools)
    (record,) = fake_upstream.model_requests
    rows = await asyncio.to_thread(stored, gw, session)
    if protocol == "anthropic" and tools:
        assert rows[0] == ("user", "where is the loader?", False)
        assert await asyncio.to_thread(record.client_gone.wait, 5.0)
        return
    assert rows[0] == ("user", "where is the loader?", True)
    assert [(role, complete) for role, _, complete in rows[1:]] == [("assistant", True)]
    assert rows[1][1]
    assert record.finished_at is not None and not record.client_gone.is_set()


async def test_a_provider_that_never_ends_the_body_after_the_terminal_is_cut(
        make_gateway: Any, fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for the end of body after the client left is bounded."""
    monkeypatch.setattr(channel, "AFTER_ANSWER_S", 0.3)
    gw = make_gateway()
    left = await leave_at_the_terminal(gw, "anthropic", "linger-forever", "linger")
    (record,) = fake_upstream.model_requests
    assert await asyncio.to_thread(record.client_gone.wait, 5.0)
    assert record.client_gone_at is not None and 0.2 < record.client_gone_at - left < 3.0


async def leave_at_the_terminal(gw: Any, protocol: str, session: str, scenario: str, *,
                                tools: bool = False) -> float:
    """Stream a request and close the connection on the answer's terminal frame;
    when it closed (``time.monotonic``)."""
    path, body, last = LINGERED[protocol]
    body = {**body, "stream": True, **({"tools": [TOOL[protocol]]} if tools else {})}
    async with aiohttp.ClientSession() as http:
        response = await http.post(gw.url + path, json=body, headers={
            "authorization": f"Bearer {KEY}", "x-api-key": KEY,
            "anthropic-version": "2023-06-01", "x-lore-session-id": session,
            "x-fake-scenario": scenario})
        seen = b""
        while last not in seen:
            chunk = await response.content.readany()
            assert chunk, seen
            seen += chunk
        response.close()  # as the client got the terminal frame, before the end of body
        return time.monotonic()
