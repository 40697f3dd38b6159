"""The Responses history adapter: plain dicts in, values out."""

from __future__ import annotations

from lore_gateway.compaction.detect import Flow
from lore_gateway.protocols.history_common import OPENAI_24H_TTL_S, PROMPT_CACHE_TTL_S
from lore_gateway.protocols.history_responses import RESPONSES


def msg(role: str, text: str) -> dict[str, object]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


DEV = msg("developer", "be careful")
USER = msg("user", "fix it")
CALL = {"type": "function_call", "call_id": "c", "name": "sh", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c", "output": "done"}


def test_items_lead_and_roles() -> None:
    assert RESPONSES.items_key == "input"
    assert RESPONSES.instructions_file == "AGENTS.md"
    assert RESPONSES.lead_count([DEV, msg("system", "s"), USER, DEV]) == 2
    assert RESPONSES.is_user_text(USER) and RESPONSES.is_user_text(
        {"role": "user", "content": "typeless"})
    assert not RESPONSES.is_user_text({"type": "input_image", "role": "user"})
    assert RESPONSES.is_tool_output(OUTPUT)
    assert RESPONSES.is_tool_output({"type": "custom_tool_call_output", "output": "x"})
    assert not RESPONSES.is_tool_output(CALL)
    assert RESPONSES.is_assistant_side(CALL) and RESPONSES.is_assistant_side(
        {"type": "reasoning"}) and RESPONSES.is_assistant_side(msg("assistant", "ok"))
    assert RESPONSES.is_system(DEV) and not RESPONSES.is_system(
        {"type": "reasoning", "role": "developer"})
    assert RESPONSES.user_text(USER) == "fix it"
    assert RESPONSES.thinking_mode({"thinking": {"type": "enabled"}}) is None


def test_output_shrinking_and_boundary() -> None:
    assert RESPONSES.shrink_output(OUTPUT, str.upper) == {**OUTPUT, "output": "DONE"}
    assert RESPONSES.shrink_output(OUTPUT, lambda text: None) is OUTPUT
    listed = {**OUTPUT, "output": [{"type": "input_text", "text": "t"}]}
    assert RESPONSES.shrink_output(listed, str.upper) is listed
    assert RESPONSES.without_tool_results(OUTPUT) is None


def test_messages_and_updates() -> None:
    assert RESPONSES.user_message("hi", {"type": "ephemeral"}) == msg("user", "hi")
    assert RESPONSES.assistant_message("ok") == msg("assistant", "ok")
    assert RESPONSES.update_items("new", "noted") == [msg("developer", "new")]


def test_add_system_text() -> None:
    out = RESPONSES.add_system_text({"instructions": "be brief", "input": [USER]}, "K")
    assert out == {"instructions": "be brief\n\nK", "input": [USER]}
    out = RESPONSES.add_system_text({"input": [DEV, USER]}, "K")
    assert out["input"] == [DEV, msg("developer", "K"), USER]
    out = RESPONSES.add_system_text({"input": "hello"}, "K")
    assert out["input"] == [msg("developer", "K"), msg("user", "hello")]
    bare = {"model": "m"}
    assert RESPONSES.add_system_text(bare, "K") is bare


def test_caching_has_no_markers() -> None:
    assert RESPONSES.cache_ttl({}) == PROMPT_CACHE_TTL_S
    assert RESPONSES.cache_ttl({"prompt_cache_retention": "24h"}) == OPENAI_24H_TTL_S
    assert RESPONSES.cache_marker({}, [USER]) is None
    items = [USER]
    assert RESPONSES.fit_breakpoints({}, items, 0) is items


def test_compaction_flows_are_codexs() -> None:
    trigger = {"input": [USER, {"type": "compaction_trigger"}]}
    assert RESPONSES.compaction_flow(trigger, {}) is Flow.CODEX_TRIGGER
    meta = {"x-codex-turn-metadata": '{"request_kind": "compaction"}'}
    assert RESPONSES.compaction_flow({"input": [USER]}, meta) is Flow.CODEX_LOCAL
    assert RESPONSES.compaction_flow({"input": [USER]}, {}) is None


def test_usage_scales_every_figure_by_one_factor() -> None:
    usage = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 800},
             "output_tokens": 200, "output_tokens_details": {"reasoning_tokens": 100},
             "total_tokens": 1200}
    assert RESPONSES.usage_scaler().scale(usage, lambda total: 0.5, "response.completed")
    assert usage == {"input_tokens": 500, "input_tokens_details": {"cached_tokens": 400},
                     "output_tokens": 100, "output_tokens_details": {"reasoning_tokens": 50},
                     "total_tokens": 600}
    assert not RESPONSES.usage_scaler().scale(usage, lambda total: None, None)
