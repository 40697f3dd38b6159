"""Marker expansion for Chat Completions requests: the assistant message is cut back
into the follow-up's exact messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.recall.chat.expand import expand_messages
from lore_gateway.recall.chat.live import marker_content
from lore_gateway.recall.core.anchor_context import prefix_context_id
from lore_gateway.recall.core.markers import anchored_marker, search_marker

A1 = "0b0f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d"
A2 = "1c1f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d"
M1 = anchored_marker(search_marker("deploy"), A1)
M2 = anchored_marker(search_marker("rotation", "project"), A2)
USER = {"role": "user", "content": "Where do we deploy?"}
NEXT = {"role": "user", "content": "thanks"}


@dataclass(frozen=True)
class Stored:
    assistant: dict[str, Any]
    tool_result: dict[str, Any]
    context_id: str


def stored(call_id: str, content: str | None) -> Stored:
    call = {"id": call_id, "type": "function",
            "function": {"name": "recall", "arguments": '{"query":"x"}'}}
    return Stored({"role": "assistant", "content": content, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call_id, "content": f"result {call_id}"},
                  prefix_context_id([USER]))


STORE = {A1: stored("call_1", "Let me check."), A2: stored("call_2", "Found it.")}


def lookup(anchor: str) -> Stored | None:
    return STORE.get(anchor)


def test_preamble_marker_continuation_becomes_the_follow_up_messages() -> None:
    content = "Let me check." + marker_content("Let me check.", M1) + "We deploy to blue."
    expanded = expand_messages([USER, {"role": "assistant", "content": content}, NEXT], lookup)
    assert expanded is not None
    s = STORE[A1]
    assert orjson.dumps(expanded[:3]) == orjson.dumps([USER, s.assistant, s.tool_result])
    assert expanded[3:] == [{"role": "assistant", "content": "We deploy to blue."}, NEXT]


def test_chained_recalls_in_one_message() -> None:
    # What a streaming client receives for two recalls: marker_content() each time,
    # with all earlier round text as what came before.
    content = ("Let me check." + marker_content("Let me check.", M1) + "Found it."
               + marker_content("Let me check.Found it.", M2) + "Done.")
    expanded = expand_messages([USER, {"role": "assistant", "content": content}], lookup)
    assert expanded is not None
    a, b = STORE[A1], STORE[A2]
    assert expanded == [USER, a.assistant, a.tool_result, b.assistant, b.tool_result,
                        {"role": "assistant", "content": "Done."}]


def test_marker_first_and_nothing_after_it_adds_no_empty_message() -> None:
    first = stored("call_3", None)
    content = marker_content("", M1)
    expanded = expand_messages([USER, {"role": "assistant", "content": content}, NEXT],
                               lambda anchor: first if anchor == A1 else None)
    assert expanded == [USER, first.assistant, first.tool_result, NEXT]


def test_visible_tool_calls_stay_on_the_last_piece() -> None:
    visible = [{"id": "call_v", "type": "function",
                "function": {"name": "exec", "arguments": "{}"}}]
    content = "Let me check." + marker_content("Let me check.", M1)
    message = {"role": "assistant", "content": content, "tool_calls": visible}
    expanded = expand_messages([USER, message], lookup)
    assert expanded is not None
    assert expanded[-1] == {"role": "assistant", "content": None, "tool_calls": visible}


def test_edited_preamble_keeps_the_client_text() -> None:
    content = "Let me look!" + marker_content("Let me look!", M1) + "Blue."
    expanded = expand_messages([USER, {"role": "assistant", "content": content}], lookup)
    assert expanded is not None
    assert expanded[1] == {**STORE[A1].assistant, "content": "Let me look!"}


def test_unknown_foreign_or_quoted_markers_are_left_alone() -> None:
    other = M1.replace(A1, "11111111-2222-4333-8444-555555555555")
    assert expand_messages([USER, {"role": "assistant", "content": other}], lookup) is None
    elsewhere = {"role": "user", "content": "Something else"}
    assert expand_messages([elsewhere, {"role": "assistant", "content": M1}], lookup) is None
    assert expand_messages([{"role": "user", "content": M1}], lookup) is None
