"""Gemini anchors back into the exact recall pair (lore-spec B.6), sans-IO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lore_gateway.recall.core.anchor_context import prefix_context_id
from lore_gateway.recall.core.chain import RecallCall
from lore_gateway.recall.gemini.expand import expand_contents
from lore_gateway.recall.gemini.handler import follow_up_pair
from lore_gateway.recall.gemini.live import marker_content

ANCHOR = "11111111-2222-4333-8444-555555555555"
MARKER = f'📚 Searching all archives for "deploy"…\n<!-- lore-recall:{ANCHOR} -->'
USER = {"role": "user", "parts": [{"text": "Where do we deploy?"}]}
THOUGHT = {"text": "I should look.", "thought": True}
CALL = {"functionCall": {"name": "recall", "args": {"query": "deploy"}},
        "thoughtSignature": "sig"}


@dataclass(frozen=True)
class Stored:
    assistant: dict[str, Any]
    tool_result: dict[str, Any]
    context_id: str


def stored(parts: list[dict[str, Any]]) -> Stored:
    model, response = follow_up_pair(parts, RecallCall("", '{"query":"deploy"}',
                                                       len(parts) - 1), "blue cluster")
    return Stored(model, response, prefix_context_id([USER]))


def test_a_merged_text_part_expands_into_the_stored_pair_verbatim() -> None:
    pair = stored([THOUGHT, {"text": "Checking."}, CALL])
    # Gemini CLI merges the answer's text parts and drops the thought.
    text = "Checking." + marker_content("Checking.", MARKER) + "It is the blue cluster."
    contents = [USER, {"role": "model", "parts": [{"text": text}]}]
    expanded = expand_contents(contents, {ANCHOR: pair}.get)
    assert expanded == [USER, pair.assistant, pair.tool_result,
                        {"role": "model", "parts": [{"text": "It is the blue cluster."}]}]
    assert expanded[1] is pair.assistant  # byte-stable: the prompt cache keeps hitting


def test_a_recall_with_no_text_before_it() -> None:
    pair = stored([CALL])
    contents = [USER, {"role": "model", "parts": [{"text": marker_content("", MARKER)},
                                                  {"text": "Blue."}]}]
    expanded = expand_contents(contents, {ANCHOR: pair}.get)
    assert expanded == [USER, pair.assistant, pair.tool_result,
                        {"role": "model", "parts": [{"text": "Blue."}]}]


def test_other_client_text_keeps_the_client_parts_and_adds_the_call() -> None:
    pair = stored([{"text": "Checking."}, CALL])
    contents = [USER, {"role": "model", "parts": [
        {"text": "Edited." + marker_content("Edited.", MARKER)}]}]
    expanded = expand_contents(contents, {ANCHOR: pair}.get)
    assert expanded == [USER, {"role": "model", "parts": [{"text": "Edited."}, CALL]},
                        pair.tool_result]


def test_a_visible_call_before_the_marker_moves_after_the_pair() -> None:
    read = {"functionCall": {"name": "read_file", "args": {}}}
    pair = stored([read, CALL])
    contents = [USER, {"role": "model", "parts": [read, {"text": MARKER + "\n\n"}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "read_file",
                                                                 "response": {}}}]}]
    expanded = expand_contents(contents, {ANCHOR: pair}.get)
    assert expanded is not None
    assert expanded[1] == {"role": "model", "parts": [CALL]}
    assert expanded[2] == pair.tool_result
    assert expanded[3] == {"role": "model", "parts": [read]}
    assert expanded[4] == contents[2]


def test_an_anchor_from_another_conversation_stays_text() -> None:
    pair = Stored(*follow_up_pair([CALL], RecallCall("", "{}", 0), "r"), context_id="other")
    contents = [USER, {"role": "model", "parts": [{"text": MARKER}]}]
    assert expand_contents(contents, {ANCHOR: pair}.get) is None
    assert expand_contents(contents, {}.get) is None


def test_the_user_text_is_the_fingerprint() -> None:
    assert prefix_context_id([USER]) != prefix_context_id([])
    with_response = [USER, {"role": "user", "parts": [{"functionResponse": {
        "name": "recall", "response": {"output": "x"}}}]}]
    assert prefix_context_id(with_response) == prefix_context_id([USER])
