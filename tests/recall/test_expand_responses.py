"""Anchor expansion for Responses requests: the exact stored items, only where they belong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.recall.core.anchor_context import prefix_context_id
from lore_gateway.recall.responses.expand import expand_input

ANCHOR = "0b0f3c1e-8f3a-4c53-9a57-9d4c8a1b2c3d"
ANCHOR_TEXT = f"<!-- lore-recall:{ANCHOR} -->"
USER = {"type": "message", "role": "user", "content": "Where do we deploy?"}
CALL = {"type": "function_call", "call_id": "call_1", "name": "recall",
        "arguments": '{"query":"deploy","scope":null}'}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "blue cluster"}
ANSWER = {"type": "message", "role": "assistant", "id": "msg_2",
          "content": [{"type": "output_text", "text": "We deploy to blue.", "annotations": []}]}
NEXT = {"role": "user", "content": "thanks"}


@dataclass(frozen=True)
class Stored:
    assistant: dict[str, Any]
    tool_result: dict[str, Any]
    context_id: str


STORED = Stored(CALL, OUTPUT, prefix_context_id([USER]))


def lookup(anchor: str) -> Stored | None:
    return STORED if anchor == ANCHOR else None


def anchor_item(**extra: Any) -> dict[str, Any]:
    return {"id": "msg_resp_0", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": ANCHOR_TEXT, "annotations": []}],
            **extra}


def test_anchor_item_becomes_the_stored_pair_byte_identical() -> None:
    body = {"model": "m", "input": [USER, anchor_item(), ANSWER, NEXT]}
    expanded = expand_input(body, lookup)
    assert expanded is not None
    assert expanded["input"] == [USER, CALL, OUTPUT, ANSWER, NEXT]
    assert orjson.dumps(expanded["input"][:3]) == orjson.dumps([USER, CALL, OUTPUT])
    assert body["input"][1] == anchor_item()  # the client's body is not mutated


def test_anchor_inside_merged_text_splits_the_item() -> None:
    merged = {"type": "message", "role": "assistant", "id": "msg_1", "content": [
        {"type": "output_text", "text": "Let me look." + ANCHOR_TEXT + "We deploy to blue."}]}
    expanded = expand_input({"input": [USER, merged, NEXT]}, lookup)
    assert expanded is not None
    user, before, call, output, after, nxt = expanded["input"]
    assert (user, call, output, nxt) == (USER, CALL, OUTPUT, NEXT)
    assert before == {**merged, "content": [{"type": "output_text", "text": "Let me look."}]}
    assert after == {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": "We deploy to blue."}]}


def test_string_content_as_a_flattening_client_sends_it() -> None:
    flat = {"role": "assistant", "content": ANCHOR_TEXT + "We deploy to blue."}
    expanded = expand_input({"input": [USER, flat, NEXT]}, lookup)
    assert expanded is not None
    assert expanded["input"] == [USER, CALL, OUTPUT,
                                 {"role": "assistant", "content": "We deploy to blue."}, NEXT]


def test_unknown_foreign_or_user_anchors_are_left_alone() -> None:
    other = "11111111-2222-4333-8444-555555555555"
    unknown = anchor_item()
    unknown["content"] = [{"type": "output_text", "text": ANCHOR_TEXT.replace(ANCHOR, other)}]
    in_user_text = {"role": "user", "content": ANCHOR_TEXT}
    assert expand_input({"input": [USER, unknown, in_user_text]}, lookup) is None
    # The right anchor in another conversation (a different first question).
    elsewhere = {"role": "user", "content": "What is the weather?"}
    assert expand_input({"input": [elsewhere, anchor_item(), NEXT]}, lookup) is None
    assert expand_input({"input": "just a string"}, lookup) is None


def test_reasoning_and_ids_before_the_anchor_do_not_change_the_context() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "opaque", "summary": []}
    user_with_parts = {"role": "user", "content": [
        {"type": "input_text", "text": "Where do we deploy?"}]}
    expanded = expand_input({"input": [user_with_parts, reasoning, anchor_item(), NEXT]}, lookup)
    assert expanded is not None
    assert expanded["input"][2:4] == [CALL, OUTPUT]
