"""The Anthropic history adapter: plain dicts in, values out."""

from __future__ import annotations

from typing import Any

from lore_gateway.compaction.detect import Flow
from lore_gateway.protocols.history_anthropic import (
    ANTHROPIC,
    LONG_TTL_S,
    MAX_BREAKPOINTS,
    count_breakpoints,
    prefix_ttl,
)
from lore_gateway.protocols.history_common import OPENAI_24H_TTL_S, PROMPT_CACHE_TTL_S

USER = {"role": "user", "content": [{"type": "text", "text": "fix the build"}]}
RESULT = {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "t1", "content": "x" * 50},
    {"type": "text", "text": "and then?"}]}
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "sh"}]}
MARK = {"type": "ephemeral"}


def test_items_lead_and_roles() -> None:
    assert ANTHROPIC.items_key == "messages"
    assert ANTHROPIC.instructions_file == "CLAUDE.md"
    system = {"role": "system", "content": "mid-conversation"}
    assert ANTHROPIC.lead_count([system, USER]) == 0  # ``system`` is its own field
    assert ANTHROPIC.is_user_text(USER) and ANTHROPIC.is_user_text(
        {"role": "user", "content": "plain"})
    assert not ANTHROPIC.is_user_text(RESULT) and ANTHROPIC.is_tool_output(RESULT)
    assert not ANTHROPIC.is_tool_output(USER) and not ANTHROPIC.is_tool_output("x")
    assert ANTHROPIC.is_assistant_side(CALL)
    assert ANTHROPIC.is_system(system)
    assert not ANTHROPIC.is_system({"role": "developer", "content": "d"})
    assert ANTHROPIC.user_text(USER) == "fix the build"


def test_thinking_mode() -> None:
    assert ANTHROPIC.thinking_mode({"thinking": {"type": "adaptive"}}) == "adaptive"
    assert ANTHROPIC.thinking_mode({"thinking": {"type": "enabled", "budget_tokens": 9}}) \
        == "enabled"
    assert ANTHROPIC.thinking_mode({"thinking": {"type": "disabled"}}) is None
    assert ANTHROPIC.thinking_mode({}) is None


def test_shrink_output_touches_tool_results_only() -> None:
    blocks = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    out = ANTHROPIC.shrink_output(blocks, lambda text: f"<{text}>")
    assert out["content"][0]["content"] == "<a\nb>"
    out = ANTHROPIC.shrink_output(RESULT, lambda text: "short")
    assert out["content"] == [{**RESULT["content"][0], "content": "short"}, RESULT["content"][1]]
    assert ANTHROPIC.shrink_output(RESULT, lambda text: None) is RESULT


def test_without_tool_results_keeps_the_rest_of_the_message() -> None:
    assert ANTHROPIC.without_tool_results(RESULT) == {"role": "user",
                                                      "content": [RESULT["content"][1]]}
    only = {"role": "user", "content": [RESULT["content"][0]]}
    assert ANTHROPIC.without_tool_results(only) is None


def test_messages_and_updates() -> None:
    assert ANTHROPIC.user_message("hi", MARK) == {"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": MARK}]}
    assert ANTHROPIC.user_message("hi") == {"role": "user",
                                            "content": [{"type": "text", "text": "hi"}]}
    assert ANTHROPIC.assistant_message("ok") == {"role": "assistant",
                                                 "content": [{"type": "text", "text": "ok"}]}
    assert [m["role"] for m in ANTHROPIC.update_items("new", "noted")] == ["user", "assistant"]


def test_add_system_text_to_each_system_shape() -> None:
    assert ANTHROPIC.add_system_text({"system": "be brief"}, "K")["system"] == "be brief\n\nK"
    blocks = {"system": [{"type": "text", "text": "s", "cache_control": MARK}]}
    out = ANTHROPIC.add_system_text(blocks, "K")
    assert out["system"][-1] == {"type": "text", "text": "K"}  # no breakpoint added
    assert blocks["system"] == [{"type": "text", "text": "s", "cache_control": MARK}]
    assert ANTHROPIC.add_system_text({"system": ""}, "K")["system"] == "K"
    assert ANTHROPIC.add_system_text({}, "K")["system"] == "K"


def test_cache_ttl_reads_system_and_tool_markers() -> None:
    long = {"system": [{"type": "text", "text": "s", "cache_control": {**MARK, "ttl": "1h"}}]}
    assert ANTHROPIC.cache_ttl(long) == LONG_TTL_S
    assert ANTHROPIC.cache_ttl({"tools": [{"name": "t", "cache_control": MARK}]}) \
        == PROMPT_CACHE_TTL_S
    assert ANTHROPIC.cache_ttl({"prompt_cache_retention": "24h"}) == OPENAI_24H_TTL_S


def test_cache_marker_follows_the_clients_markers() -> None:
    tail: list[Any] = [{"role": "user", "content": [
        {"type": "text", "text": "t", "cache_control": {**MARK, "ttl": "5m"}}]}]
    system = {"system": [{"type": "text", "text": "s", "cache_control": {**MARK, "ttl": "1h"}}]}
    assert prefix_ttl(system, tail) == "5m"  # the first marker after ours
    assert prefix_ttl(system, []) == "1h"  # else the last one before it
    assert ANTHROPIC.cache_marker(system, []) == {"type": "ephemeral", "ttl": "1h"}
    assert ANTHROPIC.cache_marker({}, []) == {"type": "ephemeral"}


def test_fit_breakpoints_drops_the_oldest_from_start() -> None:
    marked = [{"role": "user", "content": [{"type": "text", "text": str(i),
                                            "cache_control": MARK}]} for i in range(6)]
    payload = {"system": [{"type": "text", "text": "s", "cache_control": MARK}]}
    out = ANTHROPIC.fit_breakpoints(payload, marked, 1)
    assert count_breakpoints(payload, out) == MAX_BREAKPOINTS
    assert "cache_control" in out[0]["content"][0]  # before ``start``: kept
    assert [("cache_control" in m["content"][0]) for m in out] == [
        True, False, False, False, True, True]
    within = marked[:MAX_BREAKPOINTS]
    assert ANTHROPIC.fit_breakpoints({}, within, 0) is within


def test_compaction_flow_is_claude_codes_summary_fork() -> None:
    fork = {"system": "You are Claude Code.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": MARK}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": [{"type": "text", "text":
            "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools. Write a summary of"
            " the conversation in <summary> tags."}]}]}
    assert ANTHROPIC.compaction_flow(fork, {}) is Flow.CLAUDE_SUMMARY
    assert ANTHROPIC.compaction_flow({"messages": [USER]}, {}) is None


def test_usage_factor_chosen_at_message_start_holds_for_the_delta() -> None:
    scaler = ANTHROPIC.usage_scaler()
    start = {"input_tokens": 100, "cache_read_input_tokens": 900, "output_tokens": 1}
    assert scaler.scale(start, lambda total: 0.5 if total > 500 else None, "message_start")
    assert start == {"input_tokens": 50, "cache_read_input_tokens": 450, "output_tokens": 0}
    delta = {"output_tokens": 40}
    assert scaler.scale(delta, lambda total: None, "message_delta")
    assert delta == {"output_tokens": 20}
    fresh = ANTHROPIC.usage_scaler()
    assert not fresh.scale({"output_tokens": 40}, lambda total: None, "message_delta")
