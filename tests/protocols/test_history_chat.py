"""The Chat Completions history adapter: plain dicts in, values out."""

from __future__ import annotations

from lore_gateway.protocols.history_chat import CHAT
from lore_gateway.protocols.history_common import OPENAI_24H_TTL_S, PROMPT_CACHE_TTL_S

SYSTEM = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "fix it"}
CALL = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}
TOOL = {"role": "tool", "tool_call_id": "c", "content": "done"}


def test_items_lead_and_roles() -> None:
    assert CHAT.items_key == "messages"
    assert CHAT.instructions_file == "AGENTS.md"
    assert CHAT.lead_count([SYSTEM, {"role": "developer", "content": "d"}, USER, SYSTEM]) == 2
    assert CHAT.is_user_text(USER) and CHAT.is_user_text(
        {"role": "user", "content": [{"type": "text", "text": "parts"}]})
    assert CHAT.is_tool_output(TOOL) and not CHAT.is_tool_output(USER)
    assert CHAT.is_assistant_side(CALL) and not CHAT.is_assistant_side(TOOL)
    assert CHAT.is_system(SYSTEM) and CHAT.is_system({"role": "developer"})
    assert CHAT.user_text({"role": "user", "content": [{"type": "text", "text": "a"},
                                                        {"type": "image_url"}]}) == "a"
    assert CHAT.thinking_mode({"thinking": {"type": "enabled"}}) is None


def test_output_shrinking_and_boundary() -> None:
    assert CHAT.shrink_output(TOOL, str.upper) == {**TOOL, "content": "DONE"}
    assert CHAT.shrink_output(TOOL, lambda text: None) is TOOL
    assert CHAT.without_tool_results(TOOL) is None


def test_messages_updates_and_system_text() -> None:
    assert CHAT.user_message("hi", {"type": "ephemeral"}) == {"role": "user", "content": "hi"}
    assert CHAT.assistant_message("ok") == {"role": "assistant", "content": "ok"}
    assert CHAT.update_items("new", "noted") == [{"role": "system", "content": "new"}]
    out = CHAT.add_system_text({"messages": [SYSTEM, USER]}, "K")
    assert out["messages"] == [SYSTEM, {"role": "system", "content": "K"}, USER]
    bare = {"model": "m"}
    assert CHAT.add_system_text(bare, "K") is bare


def test_caching_compaction_and_usage() -> None:
    assert CHAT.cache_ttl({}) == PROMPT_CACHE_TTL_S
    assert CHAT.cache_ttl({"prompt_cache_retention": "24h"}) == OPENAI_24H_TTL_S
    assert CHAT.cache_marker({}, [USER]) is None
    items = [USER]
    assert CHAT.fit_breakpoints({}, items, 0) is items
    prompt = {"role": "user", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION."}
    assert CHAT.compaction_flow({"messages": [prompt]}, {}) is None
    usage = {"prompt_tokens": 900_000, "completion_tokens": 1, "total_tokens": 900_001}
    assert not CHAT.usage_scaler().scale(usage, lambda total: 0.1, None)
    assert usage["prompt_tokens"] == 900_000
