"""The sans-IO layer planner: dicts in, dicts out (context/planner.py)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest

from lore_gateway.context import planner
from lore_gateway.context.planner import Distilled, Limits, SessionState
from lore_gateway.protocols.history import adapter_for
from lore_gateway.protocols.history_anthropic import ANTHROPIC, count_breakpoints
from lore_gateway.protocols.history_responses import RESPONSES
from lore_gateway.routing import Family

LIMITS = Limits(window=4_000, share=0.7)  # budget 2,800 tokens
SYSTEM = "You are a coding agent. " * 20
TOOLS = [{"name": "bash", "description": "Run a command.",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
ROWS = [Distilled(1, "Date: 2026-12-01\n* 🔴 (10:00) User said the port is 8417", 0, 0.0),
        Distilled(2, "Date: 2026-12-01\n* 🟡 (10:05) Agent edited src/app.py", 0, 0.0)]


def anthropic_history(rounds: int, output_chars: int = 900) -> list[dict[str, Any]]:
    """A task, then ``rounds`` tool rounds (call, output), then a text answer."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}]
    for i in range(rounds):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {i}: running a command."},
            {"type": "tool_use", "id": f"tu_{i}", "name": "bash", "input": {"cmd": f"ls {i}"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"tu_{i}",
             "content": f"output {i}: " + "x" * output_chars}]})
    return messages


def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 512, "system": SYSTEM, "tools": TOOLS,
            "messages": messages}


def run(payload: dict[str, Any], state: SessionState, now: float = 1000.0,
        family: Family = Family.ANTHROPIC) -> planner.Plan:
    size = len(orjson.dumps(payload))
    history = adapter_for(family)
    result = planner.plan(history, payload, size, state, LIMITS, now)
    if result.action == "load":
        result = planner.plan(history, payload, size, state, LIMITS, now, ROWS)
    return result


def calibrated() -> SessionState:
    return SessionState(ratio=0.25, samples=3)


def test_under_budget_passes_through_without_walking_the_history() -> None:
    payload = body(anthropic_history(2))
    result = run(payload, calibrated())
    assert result.action == "pass"
    assert planner.render(ANTHROPIC, payload, result.state) is payload


def test_over_budget_rewrites_to_prefix_and_raw_tail_keeping_system_and_tools() -> None:
    payload = body(anthropic_history(30))
    result = run(payload, calibrated())
    assert result.action == "rewrite" and result.reason == "budget"
    assert result.state.layer >= 1
    out = planner.render(ANTHROPIC, payload, result.state)
    assert out["system"] is payload["system"] and out["tools"] is payload["tools"]
    first = out["messages"][0]
    assert first["role"] == "user" and "port is 8417" in first["content"][0]["text"]
    assert len(orjson.dumps(out)) * 0.25 <= LIMITS.budget
    # The tail is the client's own last items, untouched (layer 1) or stripped.
    assert out["messages"][-1] == payload["messages"][-1]
    roles = [m["role"] for m in out["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    assert_no_orphans(out["messages"])


def assert_no_orphans(messages: list[dict[str, Any]]) -> None:
    uses = {b["id"] for m in messages for b in m["content"] if b.get("type") == "tool_use"}
    results = {b["tool_use_id"] for m in messages for b in m["content"]
               if b.get("type") == "tool_result"}
    assert uses == results


def test_mid_turn_cut_keeps_the_users_request_in_the_prefix() -> None:
    payload = body(anthropic_history(30))
    state = run(payload, calibrated()).state
    out = planner.render(ANTHROPIC, payload, state)
    assert "Fix the failing test." in out["messages"][2]["content"][0]["text"]
    # The tail starts inside the turn: prefix pair, then the request repeated.
    assert [m["role"] for m in out["messages"][:4]] == ["user", "assistant", "user",
                                                        "assistant"]


def test_between_rewrites_each_request_extends_the_previous_one() -> None:
    history = anthropic_history(30)
    state = run(body(history), calibrated()).state
    previous = planner.render(ANTHROPIC, body(history), state)["messages"]
    rewrites = 0
    for i in range(30, 60):
        history = [*history, *anthropic_history(i + 1)[-2:]]
        history[-2]["content"][1]["id"] = history[-1]["content"][0]["tool_use_id"] = f"n{i}"
        result = run(body(history), state)
        state = result.state
        now = planner.render(ANTHROPIC, body(history), state)["messages"]
        if result.action == "rewrite":
            rewrites += 1
        else:
            assert result.action == "steady"
            assert [orjson.dumps(m) for m in now[:len(previous)]] == \
                [orjson.dumps(m) for m in previous]
        previous = now
    assert 1 <= rewrites <= 10


def test_layers_never_go_down_while_warm() -> None:
    history = anthropic_history(30)
    state = run(body(history), planner.force_layer(calibrated(), 1.5)).state
    assert state.layer == 3
    for i in range(30, 90):
        history = [*history, *anthropic_history(i + 1)[-2:]]
        history[-2]["content"][1]["id"] = history[-1]["content"][0]["tool_use_id"] = f"n{i}"
        state = run(body(history), state, now=1000.0 + i).state
        assert state.layer >= 3


def test_cold_cache_rewrites_and_may_step_down() -> None:
    payload = body(anthropic_history(30))
    state = run(payload, calibrated()).state
    warm = run(payload, state, now=1010.0)
    assert warm.action == "steady"
    cold = run(payload, state, now=1000.0 + 3600)
    assert cold.action == "rewrite" and cold.reason == "cold"


def test_overflow_forces_a_higher_layer_within_the_reported_window() -> None:
    state = planner.force_layer(calibrated(), 1.5, limit=3_000)
    assert state.force_min == 3 and state.window_cap == 3_000
    payload = body(anthropic_history(30))
    result = run(payload, state)
    assert result.action == "rewrite" and result.reason == "overflow"
    assert result.state.layer >= 3
    out = planner.render(ANTHROPIC, payload, result.state)
    assert len(orjson.dumps(out)) * 0.25 <= 3_000 * LIMITS.share


def test_higher_layers_strip_old_tool_outputs_but_not_the_last_rounds() -> None:
    payload = body(anthropic_history(80, output_chars=1_000))
    size = len(orjson.dumps(payload))
    limits = Limits(window=20_000, share=0.7)
    state = planner.force_layer(calibrated(), 1.1)
    result = planner.plan(ANTHROPIC, payload, size, state, limits, 1.0, ROWS)
    assert result.state.layer == 2
    out = planner.render(ANTHROPIC, payload, result.state)
    outputs = [b["content"] for m in out["messages"] for b in m["content"]
               if b.get("type") == "tool_result"]
    client = [b["content"] for m in payload["messages"] for b in m["content"]
              if b.get("type") == "tool_result"]
    assert outputs[-4:] == client[-4:]  # the last rounds' outputs, whole
    assert "removed by lore-gateway" in outputs[0] and len(outputs) > 8


def test_emergency_layer_sizes_the_tail_and_truncates_a_huge_output() -> None:
    history = anthropic_history(2)
    history[-1]["content"][0]["content"] = "y" * 60_000
    payload = body(history)
    result = run(payload, calibrated())
    assert result.state.layer == planner.EMERGENCY
    out = planner.render(ANTHROPIC, payload, result.state)
    assert len(orjson.dumps(out)) < len(orjson.dumps(payload)) // 2


def test_client_replacing_its_history_is_followed() -> None:
    payload = body(anthropic_history(30))
    state = run(payload, calibrated()).state
    small = body(anthropic_history(1))
    result = run(small, state)
    assert result.action == "pass"
    assert planner.render(ANTHROPIC, small, result.state) is small


def test_anthropic_breakpoints_never_exceed_four() -> None:
    history = anthropic_history(30)
    for message in history[-4:]:
        message["content"][0]["cache_control"] = {"type": "ephemeral"}
    payload = body(history)
    payload["system"] = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    payload["tools"] = [{**TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    state = run(payload, calibrated()).state
    out = planner.render(ANTHROPIC, payload, state)
    assert count_breakpoints(out, out["messages"]) == 4
    prefix_blocks = out["messages"][0]["content"]
    assert "cache_control" in prefix_blocks[-1]  # ours, on the distilled prefix
    assert "cache_control" in out["messages"][-1]["content"][0]  # the client's newest


def responses_history(rounds: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "Be careful."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}]
    for i in range(rounds):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "shell",
                      "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "z" * 900})
    return items


def chat_history(rounds: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "system", "content": "Be careful."},
                                   {"role": "user", "content": "Go."}]
    for i in range(rounds):
        items.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]})
        items.append({"role": "tool", "tool_call_id": f"c{i}", "content": "z" * 900})
    return items


@pytest.mark.parametrize(("family", "key", "items"), [
    (Family.RESPONSES, "input", responses_history(30)),
    (Family.CHAT, "messages", chat_history(30)),
])
def test_openai_shapes_keep_leading_instructions_and_pair_calls(
        family: Family, key: str, items: list[dict[str, Any]]) -> None:
    payload = {"model": "gpt-test", key: items, "tools": []}
    result = run(payload, calibrated(), family=family)
    assert result.action == "rewrite"
    out = planner.render(adapter_for(family), payload, result.state)
    new = out[key]
    assert new[0] == items[0]  # the developer/system item stays first, untouched
    assert new[1]["role"] == "user" and "port is 8417" in orjson.dumps(new[1]).decode()
    calls = {i.get("call_id") for i in new if i.get("type") == "function_call"} | {
        c["id"] for i in new for c in i.get("tool_calls") or []}
    outputs = {i.get("call_id") for i in new if i.get("type") == "function_call_output"} | {
        i.get("tool_call_id") for i in new if i.get("role") == "tool"}
    assert calls - {None} == outputs - {None}


def test_calibration_moves_the_ratio_towards_reported_usage() -> None:
    state = planner.calibrate(SessionState(), 40_000, 10_000, 9_000)
    assert state.ratio == pytest.approx(0.25) and state.samples == 1
    state = planner.calibrate(state, 40_000, 20_000, 0)
    assert 0.25 < state.ratio < 0.5
    assert state.cache_read_share == pytest.approx(9_000 / 30_000)


def test_knowledge_update_positions_follow_the_rewrite() -> None:
    payload = body(anthropic_history(30))
    state = run(payload, calibrated()).state
    assert planner.remap(state, state.cut) == 3  # after the prefix pair and the request
    assert planner.remap(state, state.cut + 5) == 8
    assert planner.remap(state, 0) == 3


def test_codex_backend_shape_keeps_instructions_cache_key_and_reasoning_pairs() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}]
    for i in range(30):
        items += [{"type": "reasoning", "id": f"rs_{i}", "summary": [],
                   "encrypted_content": "gAAAA" + "q" * 200},
                  {"type": "function_call", "call_id": f"c{i}", "name": "shell",
                   "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": "z" * 900}]
    payload = {"model": "gpt-5.1-codex", "instructions": SYSTEM, "input": items,
               "tools": [], "prompt_cache_key": "thread-1", "store": False, "stream": True}
    result = run(payload, calibrated(), family=Family.RESPONSES)
    out = planner.render(RESPONSES, payload, result.state)
    assert out["instructions"] is payload["instructions"]
    assert out["prompt_cache_key"] == "thread-1"
    tail = out["input"][3:]  # prefix pair, the request of the cut turn, then raw items
    assert tail[0]["type"] == "reasoning"  # a round starts with its reasoning item
    assert tail == items[-len(tail):]
