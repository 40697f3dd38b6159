"""Rewritten contexts that the real providers accept (issue 31), checked by the
strict provider's own validator (testing/strict.py) on the planner's output.

Each test is a fault that produced requests the real Anthropic API refuses, or
lost context, before the fix: a mid-turn cut under thinking, a cache-TTL switch,
an overflow at the top layer, a dropped mid-conversation system message, a
repeated harness nudge instead of the task.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from lore_gateway.context import planner
from lore_gateway.context.planner import Distilled, Limits, SessionState
from lore_gateway.protocols.history_anthropic import ANTHROPIC
from lore_gateway.recall import replay
from lore_gateway.routing import Family
from lore_gateway.testing import strict
from lore_gateway.testing.strict import sign_thinking

LIMITS = Limits(window=6_000, share=0.7)
ROWS = [Distilled(1, "Date: 2026-12-01\n* 🔴 (10:00) User said the port is 8417", 0, 0.0)]
TOOLS = [{"name": "bash", "description": "Run a command.",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
TASK = "Fix the failing parser test in src/parse.py and explain the root cause."
NUDGE = "Please always provide EXACTLY ONE action in triple backticks, found 2 actions."


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": sign_thinking(text)}


def tool_round(i: int, *, think: bool, chars: int = 900) -> list[dict[str, Any]]:
    """One agent round: an assistant call (opened by thinking or not), its result."""
    blocks: list[dict[str, Any]] = [thinking(f"Round {i}: what next?")] if think else []
    blocks += [{"type": "text", "text": f"Step {i}."},
               {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "bash",
                "input": {"cmd": f"ls {i}"}}]
    return [{"role": "assistant", "content": blocks},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:04d}",
                                          "content": f"out {i}: " + "x" * chars}]}]


def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 512, "system": "You are a coding agent.",
            "tools": TOOLS, "messages": messages, **extra}


def run(payload: dict[str, Any], state: SessionState, now: float = 1000.0) -> planner.Plan:
    size = len(orjson.dumps(payload))
    result = planner.plan(ANTHROPIC, payload, size, state, LIMITS, now)
    if result.action == "load":
        result = planner.plan(ANTHROPIC, payload, size, state, LIMITS, now, ROWS)
    return result


def accepted(payload: dict[str, Any]) -> None:
    """The strict provider's verdict on a request: accepted, or the refusal shown."""
    refusal = strict.check("anthropic", payload, orjson.dumps(payload), window=None)
    assert refusal is None, refusal.message


CALIBRATED = SessionState(ratio=0.25, samples=3)


def test_a_mid_turn_cut_under_thinking_opens_the_final_turn_with_its_thinking() -> None:
    # One long agent turn with interleaved thinking: only every third round
    # begins with a thinking block (Claude Code's adaptive thinking does not
    # think before every call).
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text",
                                                                    "text": TASK}]}]
    for i in range(40):
        messages += tool_round(i, think=i % 3 == 0)
    payload = body(messages, thinking={"type": "enabled", "budget_tokens": 2048})
    result = run(payload, CALIBRATED)
    assert result.action == "rewrite"
    out = planner.render(ANTHROPIC, payload, result.state)
    accepted(out)
    tail = out["messages"][planner.prefix_length(result.state):]
    assert tail[0]["content"][0]["type"] == "thinking"
    # Without thinking, any round may open the tail (more room to cut).
    plain = body(messages)
    accepted(planner.render(ANTHROPIC, plain, run(plain, CALIBRATED).state))


def test_adaptive_thinking_cuts_where_the_rest_of_the_turn_did_not_think() -> None:
    """Under adaptive thinking the model thinks when it chooses: a turn that did
    not think may be cut at any round (Claude Code's tool loops against a model
    that answered without thinking), one that did is cut where a thought opens
    a round."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text",
                                                                    "text": TASK}]}]
    for i in range(40):
        messages += tool_round(i, think=False)
    quiet = body(messages, thinking={"type": "adaptive"})
    result = run(quiet, CALIBRATED)
    assert result.action == "rewrite" and result.state.request  # cut mid-turn
    accepted(planner.render(ANTHROPIC, quiet, result.state))
    messages = messages[:41]
    for i in range(40, 60):
        messages += tool_round(i, think=i % 4 == 0)
    mixed = body(messages, thinking={"type": "adaptive"})
    result = run(mixed, CALIBRATED)
    out = planner.render(ANTHROPIC, mixed, result.state)
    tail = out["messages"][planner.prefix_length(result.state):]
    assert tail[0]["role"] == "user" or tail[0]["content"][0]["type"] == "thinking"


def test_our_breakpoint_follows_the_clients_switch_from_5m_to_1h() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text",
                                                                    "text": TASK}]}]
    for i in range(40):
        messages += tool_round(i, think=False)

    def marked(ttl: str | None) -> dict[str, Any]:
        control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        history = [*messages[:-1], {**messages[-1], "content": [
            {**messages[-1]["content"][0], "cache_control": control}]}]
        return body(history, system=[{"type": "text", "text": "You are a coding agent.",
                                      "cache_control": control}])

    first = run(marked(None), CALIBRATED)
    assert first.action == "rewrite"
    accepted(planner.render(ANTHROPIC, marked(None), first.state))
    # The client switches every marker to 1h; the layout is steady (no rewrite),
    # and our marker goes to 1h with them: a 5m one between two 1h is refused.
    switched = marked("1h")
    steady = run(switched, first.state, now=1001.0)
    assert steady.action == "steady"
    out = planner.render(ANTHROPIC, switched, steady.state)
    accepted(out)
    assert out["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral",
                                                                 "ttl": "1h"}
    # The prefix's bytes apart from the marker are the ones the cache holds.
    before = planner.render(ANTHROPIC, marked(None), first.state)["messages"][0]
    assert before["content"][0]["text"] == out["messages"][0]["content"][0]["text"]


def test_an_overflow_at_the_top_layer_replans_smaller_instead_of_resending() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text",
                                                                    "text": TASK}]}]
    for i in range(60):
        messages += tool_round(i, think=False, chars=2_000)
    payload = body(messages)
    state = msgspec.structs.replace(CALIBRATED, force_min=planner.EMERGENCY)
    top = run(payload, state)
    assert top.state.layer == planner.EMERGENCY
    sent = planner.render(ANTHROPIC, payload, top.state)
    sent_bytes = len(orjson.dumps(sent))
    # The provider counts 1.5x what the calibration thought, and refuses.
    reported = int(sent_bytes * top.state.ratio * 1.5)
    forced = planner.force_layer(top.state, reported / LIMITS.window, LIMITS.window, sent_bytes)
    again = run(payload, forced, now=1001.0)
    assert again.action == "rewrite" and again.reason == "overflow"
    smaller = planner.render(ANTHROPIC, payload, again.state)
    assert len(orjson.dumps(smaller)) < sent_bytes
    assert again.state.ratio >= reported / sent_bytes
    # ... and at the true ratio it fits the budget.
    assert len(orjson.dumps(smaller)) * reported / sent_bytes <= LIMITS.budget


def test_mid_conversation_system_messages_are_kept_where_they_are_valid() -> None:
    reminder = {"role": "system", "content": "Available agent types: claude, Explore."}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": TASK}]}, reminder]
    for i in range(40):
        messages += tool_round(i, think=False)
    payload = body(messages)
    result = run(payload, CALIBRATED)
    assert result.action == "rewrite"
    out = planner.render(ANTHROPIC, payload, result.state)
    accepted(out)
    assert out["messages"][1] == reminder  # right after the prefix's user message
    assert planner.remap(result.state, result.state.cut) == planner.prefix_length(result.state)


def test_the_request_repeated_after_a_mid_turn_cut_is_the_task_not_a_nudge() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text",
                                                                    "text": TASK}]}]
    for i in range(40):
        messages += tool_round(i, think=False)
        if i in (10, 25):  # the harness complains about a malformed reply
            messages += [{"role": "assistant", "content": [{"type": "text", "text": "```a```"}]},
                         {"role": "user", "content": [{"type": "text", "text": NUDGE}]}]
    payload = body(messages)
    result = run(payload, CALIBRATED)
    assert result.action == "rewrite" and result.state.request
    assert result.state.request == TASK
    accepted(planner.render(ANTHROPIC, payload, result.state))


def test_the_size_of_an_expanded_request_is_measured_without_serialising_it() -> None:
    before = body([{"role": "user", "content": [{"type": "text", "text": TASK}]},
                   {"role": "assistant", "content": [{"type": "text", "text": "anchor"}]},
                   {"role": "user", "content": [{"type": "text", "text": "thanks"}]}])
    pair = [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_r",
                                               "name": "recall", "input": {"query": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r",
                                          "content": "result " * 2_000}]},
            {"role": "assistant", "content": [{"type": "text", "text": "answer"}]}]
    after = {**before, "messages": [before["messages"][0], *pair, before["messages"][2]]}
    size = replay.expanded_length(Family.ANTHROPIC, before, after, len(orjson.dumps(before)))
    assert size == len(orjson.dumps(after))
