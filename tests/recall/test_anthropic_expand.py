"""Marker expansion for Anthropic requests: upstream history byte-identical to the follow-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.recall.anthropic.expand import expand_messages
from lore_gateway.recall.core.anchor_context import prefix_context_id

ANCHOR = "0b0f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d"
MARKER = f'📚 Searching all archives for "deploy"…\n<!-- lore-recall:{ANCHOR} -->'
THINKING = {"type": "thinking", "thinking": "look it up", "signature": "c2ln"}
PREAMBLE = {"type": "text", "text": "Let me check."}
TOOL_USE = {"type": "tool_use", "id": "toolu_r", "name": "recall", "input": {"query": "deploy"}}


@dataclass(frozen=True)
class Stored:
    assistant: dict[str, Any]
    tool_result: dict[str, Any]
    context_id: str


USER = {"role": "user", "content": "Where do we deploy?"}
STORED = Stored(
    assistant={"role": "assistant", "content": [THINKING, PREAMBLE, TOOL_USE]},
    tool_result={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_r", "content": "blue cluster"}]},
    context_id=prefix_context_id([USER]),
)
ANSWER = {"role": "assistant", "content": [{"type": "text", "text": "We deploy to blue."}]}
NEXT = {"role": "user", "content": [{"type": "text", "text": "thanks",
                                      "cache_control": {"type": "ephemeral"}}]}


def lookup(anchor: str) -> Stored | None:
    return STORED if anchor == ANCHOR else None


def test_three_envelopes_expand_to_exact_follow_up_pair() -> None:
    follow_up = [USER, STORED.assistant, STORED.tool_result]
    client = [USER,
              {"role": "assistant", "content": [dict(THINKING), dict(PREAMBLE)]},
              {"role": "assistant", "content": [{"type": "text", "text": MARKER}]},
              ANSWER, NEXT]
    expanded = expand_messages(client, lookup)
    assert expanded is not None
    # byte-identical prefix: what the follow-up sent, then the continuation
    assert orjson.dumps(expanded[:3]) == orjson.dumps(follow_up)
    assert expanded[3:] == [ANSWER, NEXT]
    # the client's own cache breakpoint survives, and no new one appears
    assert orjson.dumps(expanded).count(b"cache_control") == 1


def test_marker_with_text_after_it_splits_the_message() -> None:
    client = [USER, {"role": "assistant", "content": [
        THINKING, PREAMBLE, {"type": "text", "text": MARKER}, ANSWER["content"][0]]}, NEXT]
    expanded = expand_messages(client, lookup)
    assert expanded == [USER, STORED.assistant, STORED.tool_result, ANSWER, NEXT]


def test_unknown_anchor_or_quoted_marker_is_left_alone() -> None:
    other = MARKER.replace(ANCHOR, "11111111-2222-4333-8444-555555555555")
    quoted = {"type": "text", "text": "he wrote " + MARKER}
    client = [USER, {"role": "assistant", "content": [{"type": "text", "text": other}]},
              {"role": "assistant", "content": [quoted]}, NEXT]
    assert expand_messages(client, lookup) is None


def test_changed_preamble_keeps_client_blocks_and_inserts_tool_use() -> None:
    edited = {"type": "text", "text": "Let me check!"}
    client = [USER, {"role": "assistant", "content": [edited, {"type": "text", "text": MARKER}]},
              ANSWER]
    expanded = expand_messages(client, lookup)
    assert expanded == [USER, {"role": "assistant", "content": [edited, TOOL_USE]},
                        STORED.tool_result, ANSWER]
