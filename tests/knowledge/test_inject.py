"""inject_knowledge and update_slot on payloads of the three protocol families."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import orjson
import pytest

from lore_gateway.knowledge.inject import (
    Delta,
    KnowledgeContext,
    KnowledgeView,
    inject_knowledge,
    update_slot,
)
from lore_gateway.protocols.history import adapter_for
from lore_gateway.protocols.history_anthropic import ANTHROPIC
from lore_gateway.protocols.history_chat import CHAT
from lore_gateway.protocols.history_responses import RESPONSES

BLOCK = "## Long-term knowledge\n* **deploy branch**: tangerine"


def anthropic(system: Any = "You are a coding agent.") -> dict[str, Any]:
    return {"model": "claude", "system": system, "tools": [{"name": "t"}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi",
                                      "cache_control": {"type": "ephemeral"}}]}]}


def responses(instructions: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    if instructions is not None:
        body["instructions"] = instructions
    return body


def chat() -> dict[str, Any]:
    return {"model": "gpt", "messages": [{"role": "system", "content": "s"},
                                         {"role": "user", "content": "hi"}]}


def ctx(family: str, block: str = BLOCK, *deltas: Delta) -> KnowledgeContext:
    return KnowledgeContext(family, KnowledgeView(block, deltas))  # type: ignore[arg-type]


def breakpoints(value: Any) -> int:
    return json.dumps(value).count("cache_control")


@pytest.mark.parametrize("family,payload", [("anthropic", anthropic()),
                                            ("responses", responses()), ("chat", chat())])
def test_nothing_to_add_returns_the_same_object(family: str, payload: dict[str, Any]) -> None:
    assert inject_knowledge(payload, KnowledgeContext(family, None)) is payload  # type: ignore[arg-type]
    assert inject_knowledge(payload, ctx(family, "")) is payload


def test_anthropic_block_ends_the_system_prompt_and_adds_no_breakpoint() -> None:
    original = anthropic()
    before = copy.deepcopy(original)
    out = inject_knowledge(original, ctx("anthropic"))
    assert original == before
    assert out["system"] == "You are a coding agent.\n\n" + BLOCK
    assert out["messages"] == original["messages"]
    listed = anthropic([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}])
    out = inject_knowledge(listed, ctx("anthropic"))
    assert out["system"][-1] == {"type": "text", "text": BLOCK}
    assert breakpoints(out) == breakpoints(listed)


def test_responses_block_goes_into_instructions_or_after_the_leading_developer_items() -> None:
    out = inject_knowledge(responses("be brief"), ctx("responses"))
    assert out["instructions"] == "be brief\n\n" + BLOCK
    out = inject_knowledge(responses(), ctx("responses"))
    assert [i["role"] for i in out["input"]] == ["developer", "developer", "user"]
    assert out["input"][1]["content"][0]["text"] == BLOCK
    out = inject_knowledge({"model": "gpt", "input": "hello"}, ctx("responses"))
    assert out["input"][0]["content"][0]["text"] == BLOCK
    assert out["input"][1]["content"][0]["text"] == "hello"


def test_chat_block_is_a_system_message_after_the_leading_ones() -> None:
    out = inject_knowledge(chat(), ctx("chat"))
    assert out["messages"] == [{"role": "system", "content": "s"},
                               {"role": "system", "content": BLOCK},
                               {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("family", ["anthropic", "responses", "chat"])
def test_each_request_extends_the_previous_one_byte_for_byte(family: str) -> None:
    """A session's turns, with an update given at turn 2: the upstream bodies of
    consecutive turns share every byte of the earlier one's items."""
    key = "input" if family == "responses" else "messages"
    payload = {"anthropic": anthropic, "responses": responses, "chat": chat}[family]()
    user = payload[key][-1]
    assistant = ({"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "ok"}]} if family == "responses"
        else {"role": "assistant", "content": "ok"})
    deltas: list[Delta] = []
    sent: list[dict[str, Any]] = []
    for turn in range(4):
        if turn:
            payload = {**payload, key: [*payload[key], assistant, user]}
        if turn == 2:
            slot = update_slot(adapter_for(family), payload[key])  # type: ignore[arg-type]
            assert slot == len(payload[key]) - 1
            deltas.append(Delta(slot, "[update] port 8443"))
        sent.append(inject_knowledge(payload, ctx(family, BLOCK, *deltas)))
    for earlier, later in itertools.pairwise(sent):
        n = len(earlier[key])
        assert orjson.dumps(later[key][:n]) == orjson.dumps(earlier[key])
        assert later.get("system") == earlier.get("system")
    assert json.dumps(sent[3]).count("[update] port 8443") == 1


def test_update_slot_never_splits_a_tool_call_from_its_result() -> None:
    tool_loop = [{"role": "user", "content": "fix it"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "1"}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]}]
    assert update_slot(ANTHROPIC, tool_loop) is None
    codex_loop = [{"type": "message", "role": "user", "content": []},
                  {"type": "function_call", "call_id": "c"},
                  {"type": "function_call_output", "call_id": "c"}]
    assert update_slot(RESPONSES, codex_loop) is None
    # Claude Code ends its first request with a system message after the user's.
    claude = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
              {"role": "system", "content": "agents"}]
    assert update_slot(ANTHROPIC, claude) == 0
    assert update_slot(CHAT, "not a list") is None


def test_anthropic_update_is_a_user_assistant_pair() -> None:
    payload = anthropic()
    payload["messages"] = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}]
    out = inject_knowledge(payload, ctx("anthropic", "", Delta(2, "new")))
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant",
                                                    "user"]
    assert out["messages"][2]["content"][0]["text"] == "new"
    assert out["system"] == payload["system"]


def test_an_update_whose_place_is_gone_is_left_out() -> None:
    """After a client-side compaction the stored position points elsewhere (here
    at a tool result): the update is not inserted there."""
    payload = anthropic()
    payload["messages"] = [
        {"role": "user", "content": "summary of earlier work"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "1"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1"}]}]
    out = inject_knowledge(payload, ctx("anthropic", "", Delta(2, "new"), Delta(9, "far")))
    assert out["messages"] == payload["messages"]


def test_a_full_block_keeps_the_most_confident_entries_in_a_stable_order() -> None:
    from lore_gateway.knowledge.block import render_block
    from lore_gateway.knowledge.store import Entry

    def entry(i: int, confidence: float, category: str) -> Entry:
        return Entry(f"id{i:02d}", "t", "/p", category, f"title {i:02d}", "x" * 200,
                     confidence, "", False, 0.0, float(i))

    many = [entry(i, 0.6 if i % 2 else 1.0, "pattern" if i < 10 else "decision")
            for i in range(20)]
    text, ids = render_block(many, budget_tokens=400)
    chosen = {e.id: e for e in many if e.id in ids}
    assert ids and all(e.confidence == 1.0 for e in chosen.values())
    assert ids == ["id12", "id14", "id16", "id18"]  # the most recently confirmed, sorted
    assert "### Decision" in text and "### Pattern" not in text
    assert render_block(list(reversed(many)), budget_tokens=400) == (text, ids)
