"""Side channels by shape (issue 33, item 6; knowledge/sidechannel.py), on real
request shapes: the captured Claude Code and Codex requests in
../shared/fixtures, and the aider, OpenCode, SDK and Claude Code helper shapes
of ``testing/client_shapes.py`` (each built from the client's source, named
there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.knowledge.sidechannel import is_coding_turn, side_channel_reason
from lore_gateway.testing import client_shapes as shapes
from lore_gateway.worker import requests as wreq

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
CAPTURED = {
    "claude-code": ("anthropic", "messages_turn1_request.json"),
    "claude-code-after-tool": ("anthropic", "messages_after_unknown_recall_tool_use_request.json"),
    "codex-apikey": ("responses", "apikey_custom_provider__turn1_request.json"),
    "codex-chatgpt": ("responses",
                      "chatgpt_login_custom_provider__backend_api_codex_responses_request.json"),
    "codex-zstd": ("responses", "chatgpt_login_builtin_provider__zstd_request_decompressed.json"),
}


def captured(name: str) -> tuple[dict[str, str], dict[str, Any]]:
    request = json.loads(next(FIXTURES.glob(f"*/captured-requests/{name}")).read_text())
    return {k.lower(): v for k, v in request["headers"].items()}, request["body"]


@pytest.mark.parametrize("which", CAPTURED)
def test_captured_agent_turns_are_coding_turns(which: str) -> None:
    family, name = CAPTURED[which]
    headers, body = captured(name)
    assert side_channel_reason(family, body, headers) is None


def test_codex_marks_its_helper_requests() -> None:
    headers, body = captured(CAPTURED["codex-apikey"][1])
    meta = json.loads(headers["x-codex-turn-metadata"])
    for kind, coding in (("turn", True), ("title", False), ("compact", False)):
        marked = {**headers, "x-codex-turn-metadata": json.dumps({**meta, "request_kind": kind})}
        assert is_coding_turn("responses", body, marked) is coding


def test_claude_code_classifiers_stop_at_their_verdict_tag() -> None:
    headers, body = captured(CAPTURED["claude-code"][1])
    for stop in (["</block>"], ["</severity>"], ["</verdict>\n"]):
        assert side_channel_reason("anthropic", {**body, "stop_sequences": stop}, headers) \
            == "classifier"
    assert is_coding_turn("anthropic", {**body, "stop_sequences": ["\n\nHuman:"]}, headers)
    # Chat's ``stop`` too, a string or a list.
    assert side_channel_reason("chat", {"stop": "</answer>", "messages": []}, {}) == "classifier"


AIDER = {"examples-as-messages": {}, "examples-in-system": {"examples_as_sys_msg": True},
         "reminder-in-user-message": {"reminder": "user"},
         "no-system-prompt": {"use_system_prompt": False}}


@pytest.mark.parametrize("options", AIDER.values(), ids=AIDER.keys())
def test_aider_turns_are_coding_turns_from_the_first(options: dict[str, Any]) -> None:
    """No tools, a conversation: its own "Ok." replies are there from the first
    request on, and its prompt is a coding agent's."""
    chat = shapes.AiderChat(**options)
    assert side_channel_reason("chat", chat.request("Add a --verbose flag."), {}) is None
    chat.answered("Done: see src/app.py.")
    assert side_channel_reason("chat", chat.request("Now the tests."), {}) is None


def test_aider_helper_calls_are_one_shots() -> None:
    commit = shapes.aider_commit_request("--- a/x.py\n+++ b/x.py\n+print(1)")
    assert side_channel_reason("chat", commit, {}) == "one_shot"
    summary = shapes.aider_summarize_request("# USER\nfix it\n# ASSISTANT\ndone")
    assert side_channel_reason("chat", summary, {}) == "one_shot"


def test_opencode_turns_are_coding_and_its_title_call_is_a_helper() -> None:
    headers = shapes.opencode_headers("ses_1")
    turn = shapes.opencode_request("/srv/app", [{"role": "user", "content": "fix the cart"}])
    assert side_channel_reason("anthropic", turn, headers) is None
    title = shapes.opencode_title_request("fix the cart")
    assert side_channel_reason("anthropic", title, headers) == "helper"
    # Even offered tools, a title generator is a helper.
    assert side_channel_reason("anthropic", {**title, "tools": shapes.OPENCODE_TOOLS},
                               headers) == "helper"


def test_claude_code_title_call_is_a_helper() -> None:
    body = shapes.claude_code_title_request("User: hi\n\nClaude: Hello!")
    assert side_channel_reason("anthropic", body, {}) == "helper"


def test_sdk_agents_with_a_one_line_prompt_and_tools_are_coding_turns() -> None:
    assert is_coding_turn("responses", shapes.agents_sdk_request("Weather in Paris?"), {})
    assert is_coding_turn("chat", shapes.pydantic_ai_request("Roll a die."), {})


def test_a_short_answer_without_tools_is_a_side_channel() -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": "Is this conversation about billing?"}]
    for field in ("max_tokens", "max_completion_tokens"):
        assert side_channel_reason("chat", {"messages": history, field: 5}, {}) \
            == "short_answer"
    assert side_channel_reason("responses", {"input": history, "max_output_tokens": 16}, {}) \
        == "short_answer"
    # A conversation without a cap is the conversation.
    assert side_channel_reason("chat", {"messages": history}, {}) is None


@pytest.mark.parametrize("family", ["anthropic", "responses", "chat"])
def test_our_own_worker_requests_are_side_channels(family: Any) -> None:
    body = wreq.build(family, "m", "You distil sessions.", "the segment", 500)
    assert side_channel_reason(family, body, {"x-lore-worker": "distill"}) == "worker"


def test_a_tool_less_first_request_looks_like_a_helper() -> None:
    """The trade-off the module states: a chat app's first request without tools
    is a one-shot; from its second request on it is the conversation."""
    first = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": "hi"}]}
    assert side_channel_reason("chat", first, {}) == "one_shot"
    later = {"messages": [*first["messages"], {"role": "assistant", "content": "Hello!"},
                          {"role": "user", "content": "Tell me about monads."}]}
    assert side_channel_reason("chat", later, {}) is None


def test_a_coding_prompt_that_mentions_titles_later_is_no_helper() -> None:
    """Only the opening of the instructions says what a helper is."""
    system = shapes.AIDER_MAIN_SYSTEM + "x" * 800 + "\nGenerate a title for each commit."
    body = {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "Ok."},
                         {"role": "user", "content": "go"}]}
    assert side_channel_reason("chat", body, {}) is None
