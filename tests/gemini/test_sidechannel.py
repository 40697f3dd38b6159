"""Side channels of Gemini requests (knowledge/sidechannel.py, issue 35): a
conversation is read through the history adapter (``model`` contents are the
model's turns), the instructions are ``systemInstruction``, the cap, stops and
schema are in ``generationConfig``. Gemini CLI's shapes are its requests'
(packages/core: the agent's turn offers its tools; chat compression, the
next-speaker and loop checks send the history without tools)."""

from __future__ import annotations

from typing import Any

import pytest

from lore_gateway.knowledge.sidechannel import side_channel_reason
from lore_gateway.worker import requests as wreq

TOOLS = [{"functionDeclarations": [{"name": "read_file", "description": "Read a file.",
                                    "parameters": {"type": "object"}}]}]
AGENT = {"parts": [{"text": "You are an interactive CLI agent specializing in software "
                            "engineering tasks. Your primary goal is to help users safely."}]}
HISTORY = [
    {"role": "user", "parts": [{"text": "Why does the config loader fail on Windows?"}]},
    {"role": "model", "parts": [{"text": "It joins paths with '/'; use pathlib instead."}]},
    {"role": "user", "parts": [{"text": "Do that, and add a test."}]},
]


def reason(body: dict[str, Any], headers: dict[str, str] | None = None) -> str | None:
    return side_channel_reason("gemini", body, headers or {})


def test_a_tool_less_conversation_is_a_coding_turn_and_its_first_request_a_one_shot() -> None:
    assert reason({"contents": HISTORY}) is None
    assert reason({"contents": HISTORY[:1]}) == "one_shot"
    # Tool traffic alone answers too (a model content of function calls).
    calls = [HISTORY[0],
             {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}}]},
             {"role": "user", "parts": [{"functionResponse": {
                 "name": "read_file", "response": {"output": "x = 1"}}}]}]
    assert reason({"contents": calls}) is None


def test_gemini_clis_turns_are_coding_turns() -> None:
    assert reason({"contents": HISTORY[:1], "tools": TOOLS, "systemInstruction": AGENT}) is None
    assert reason({"contents": HISTORY, "tools": TOOLS, "system_instruction": AGENT}) is None


@pytest.mark.parametrize("system", [
    {"parts": [{"text": "Generate a short title for the conversation below."}]},
    "Summarize this conversation in under 50 characters.",
    # Gemini CLI's chat compression.
    {"parts": [{"text": "You are the component that summarizes internal chat history into "
                        "a given structure."}]},
])
def test_a_helpers_instructions_in_system_instruction_make_a_helper(system: Any) -> None:
    assert reason({"contents": HISTORY, "systemInstruction": system}) == "helper"


def test_a_title_like_one_shot_is_still_a_side_channel() -> None:
    title = {"contents": [{"role": "user", "parts": [
        {"text": "Give this chat a title: how do I fix the Windows path bug?"}]}]}
    assert reason(title) == "one_shot"
    capped = {"contents": HISTORY, "generationConfig": {"maxOutputTokens": 32}}
    assert reason(capped) == "short_answer"
    assert reason({**capped, "generationConfig": {"max_output_tokens": 32}}) == "short_answer"
    assert reason({"contents": HISTORY, "generationConfig": {"maxOutputTokens": 65_536}}) is None


@pytest.mark.parametrize("config", [
    {"responseMimeType": "application/json", "responseJsonSchema": {
        "type": "object", "properties": {"next_speaker": {"enum": ["user", "model"]}}}},
    {"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT"}},
    {"stopSequences": ["</verdict>"]},
])
def test_a_verdict_asked_of_the_conversation_is_a_classifier(config: dict[str, Any]) -> None:
    # Gemini CLI's next-speaker check: the history, then its question, for JSON.
    contents = [*HISTORY, {"role": "user", "parts": [
        {"text": "Analyze only your immediately preceding response: who speaks next?"}]}]
    assert reason({"contents": contents, "generationConfig": config}) == "classifier"


def test_our_own_gemini_worker_request_is_a_side_channel() -> None:
    body = wreq.build("gemini", "gemini-2.5-flash", "You distil sessions.", "the segment", 500)
    assert reason(body, {"x-lore-worker": "distill"}) == "worker"
    assert reason(body) == "one_shot"
