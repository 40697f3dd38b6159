"""Stored order is the conversation's order (issue 33, item 5), on all three
protocols, streamed and not: a hidden recall's call is stored before the
answer that used it, where the client saw its marker (memory/store/recall_order.py).

Through a real gateway and the scripted fake: the model (``recall:<query>``)
calls recall, then answers from the result ("According to memory: …").
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import orjson
import pytest

from lore_gateway.memory.store.recall_order import place_recalls
from lore_gateway.memory.store.records import RecallRow
from lore_gateway.protocols.common import Message
from lore_gateway.testing import FakeUpstream
from lore_gateway.testing.fake_recall import TEXT_RECALL_PREAMBLE

KEY = "sk-stored-order-0123456789"
QUESTION = "which port does the staging proxy listen on?"
QUERY = "staging proxy port"
SECOND = "proxy configuration file"
ANTHROPIC_LEAD = "Let me check."  # the fake's text before its recall call
TOOL = {"path": {"type": "string"}}
REQUESTS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "anthropic": ("/v1/messages", {"x-api-key": KEY, "anthropic-version": "2023-06-01"}, {
        "model": "claude-x", "max_tokens": 256,
        "tools": [{"name": "read_file", "input_schema": {"type": "object", "properties": TOOL}}],
        "messages": [{"role": "user", "content": QUESTION}]}),
    "chat": ("/v1/chat/completions", {"authorization": f"Bearer {KEY}"}, {
        "model": "gpt-x",
        "tools": [{"type": "function", "function": {
            "name": "read_file", "parameters": {"type": "object", "properties": TOOL}}}],
        "messages": [{"role": "user", "content": QUESTION}]}),
    "responses": ("/v1/responses", {"authorization": f"Bearer {KEY}"}, {
        "model": "gpt-x",
        "tools": [{"type": "function", "name": "read_file",
                   "parameters": {"type": "object", "properties": TOOL}}],
        "input": QUESTION}),
}


def converse(gw: Any, protocol: str, session: str, *, stream: bool,
             scenario: str | None = None) -> bytes:
    path, headers, body = REQUESTS[protocol]
    headers = {**headers, "content-type": "application/json", "x-lore-session-id": session}
    if scenario is not None:
        headers["x-fake-scenario"] = scenario
    request = urllib.request.Request(gw.url + path, method="POST", headers=headers,
                                     data=orjson.dumps({**body, "stream": stream}))
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def stored(gw: Any, session: str) -> list[tuple[str, str]]:
    deadline = time.monotonic() + 10
    while gw.memory.count_turns(None, session=session) == 0 and time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        time.sleep(0.01)
    gw.memory.flush(timeout=10)
    return [(m.role, m.content) for m in gw.memory.session_messages(None, session)]


def shape(rows: list[tuple[str, str]]) -> list[str]:
    """Each stored row as what it is: the question, a recall call (by its
    query), the preamble, the answer."""
    out = []
    for role, text in rows:
        if text.startswith("[tool_call:recall] "):
            out.append("call:" + orjson.loads(text.split(" ", 1)[1])["query"])
        elif text.startswith("According to memory"):
            out.append("answer")
        elif role == "user":
            out.append("question" if text == QUESTION else text)
        else:
            out.append(text)
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("protocol", ["anthropic", "chat", "responses"])
def test_the_recall_call_is_stored_before_the_answer_that_used_it(
        gateway: Any, fake_upstream: FakeUpstream, protocol: str, stream: bool) -> None:
    session = f"order-{protocol}-{stream}"
    raw = converse(gateway, protocol, session, stream=stream, scenario=f"recall:{QUERY}")
    assert b"lore-recall:" in raw  # the client got the marker, not the call
    lead = [ANTHROPIC_LEAD] if protocol == "anthropic" else []
    assert shape(stored(gateway, session)) == ["question", *lead, f"call:{QUERY}", "answer"]
    assert len(fake_upstream.model_requests) == 2


@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
def test_chained_recalls_are_stored_each_at_its_place(
        gateway: Any, fake_upstream: FakeUpstream, protocol: str) -> None:
    """Two recalls in one answer (the model recalls again after the first
    result): each call where the client saw its marker, the answer last."""
    session = f"order-chain-{protocol}"
    fake_upstream.script([f"recall:{QUERY}", f"call-recall:{SECOND}", f"recall:{SECOND}"])
    converse(gateway, protocol, session, stream=True)
    lead = [ANTHROPIC_LEAD] if protocol == "anthropic" else []
    assert shape(stored(gateway, session)) == [
        "question", *lead, f"call:{QUERY}", *lead, f"call:{SECOND}", "answer"]


def test_responses_text_before_the_call_stays_before_it(
        gateway: Any, fake_upstream: FakeUpstream) -> None:
    session = "order-responses-preamble"
    converse(gateway, "responses", session, stream=True, scenario=f"text-recall:{QUERY}")
    assert shape(stored(gateway, session)) == [
        "question", TEXT_RECALL_PREAMBLE, f"call:{QUERY}", "answer"]


# --- the pure placement ------------------------------------------------------------

ANCHOR_A = "11111111-1111-4111-8111-111111111111"
ANCHOR_B = "22222222-2222-4222-8222-222222222222"


def marker(anchor: str) -> str:
    return f'📚 Searching all archives for "x"…\n<!-- lore-recall:{anchor} -->'


def call(name: str) -> Message:
    return Message("assistant", f"[tool_call:recall] {name}")


def test_a_chat_message_is_cut_at_each_marker() -> None:
    text = f"Let me see.\n\n{marker(ANCHOR_A)}\n\nStill looking.\n\n{marker(ANCHOR_B)}\n\nFound it."
    out = place_recalls([Message("assistant", text)],
                        [RecallRow(ANCHOR_A, call("a")), RecallRow(ANCHOR_B, call("b"))])
    assert [m.text for m in out] == [
        f"Let me see.\n\n{marker(ANCHOR_A)}", call("a").text,
        f"Still looking.\n\n{marker(ANCHOR_B)}", call("b").text, "Found it."]


def test_an_anthropic_marker_message_becomes_its_call() -> None:
    outputs = [Message("assistant", "Let me check."), Message("assistant", marker(ANCHOR_A)),
               Message("assistant", "The answer.")]
    out = place_recalls(outputs, [RecallRow(ANCHOR_A, call("a"))])
    assert [m.text for m in out] == ["Let me check.", marker(ANCHOR_A), call("a").text,
                                     "The answer."]


def test_a_call_without_its_marker_goes_first_and_nothing_else_moves() -> None:
    outputs = [Message("assistant", "The answer.")]
    assert place_recalls(outputs, []) == outputs
    out = place_recalls(outputs, [RecallRow(ANCHOR_A, call("a")), RecallRow(None, call("b"))])
    assert [m.text for m in out] == [call("a").text, call("b").text, "The answer."]
    # A marker of another turn's recall (quoted back) is left as it is.
    quoted = [Message("assistant", f"as before: {marker(ANCHOR_B)}")]
    assert place_recalls(quoted, [RecallRow(ANCHOR_A, call("a"))])[1:] == quoted
