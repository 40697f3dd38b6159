"""Anthropic expansion and ``cache_control``: breakpoints are kept, moved with the
block they sat on, and never added; a foreign conversation is not expanded."""

from __future__ import annotations

from test_anthropic_expand import MARKER, PREAMBLE, STORED, THINKING, TOOL_USE, USER, lookup

from lore_gateway.recall.anthropic.expand import expand_messages

EPHEMERAL = {"type": "ephemeral"}


def test_breakpoint_on_the_marker_moves_to_the_tool_use() -> None:
    marker = {"type": "text", "text": MARKER, "cache_control": EPHEMERAL}
    client = [USER, {"role": "assistant", "content": [THINKING, PREAMBLE]},
              {"role": "assistant", "content": [marker]}]
    expanded = expand_messages(client, lookup)
    assert expanded == [USER, {"role": "assistant", "content": [
        THINKING, PREAMBLE, {**TOOL_USE, "cache_control": EPHEMERAL}]}, STORED.tool_result]


def test_breakpoint_on_the_preamble_is_kept() -> None:
    preamble = {**PREAMBLE, "cache_control": EPHEMERAL}
    client = [USER, {"role": "assistant", "content": [THINKING, preamble]},
              {"role": "assistant", "content": [{"type": "text", "text": MARKER}]}]
    expanded = expand_messages(client, lookup)
    assert expanded == [USER, {"role": "assistant", "content": [THINKING, preamble, TOOL_USE]},
                        STORED.tool_result]


def test_marker_in_another_conversation_is_left_alone() -> None:
    client = [{"role": "user", "content": "Another question"},
              {"role": "assistant", "content": [{"type": "text", "text": MARKER}]}]
    assert expand_messages(client, lookup) is None
