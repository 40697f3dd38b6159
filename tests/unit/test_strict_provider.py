"""The fake provider's strict mode: it refuses what the real APIs refuse, in their
words, and accepts what they accept (real captured client requests included)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.testing import FakeUpstream, strict
from lore_gateway.testing.fake_compaction import FAKE_ENCRYPTED
from lore_gateway.testing.strict import Refusal

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
SIG = strict.sign_thinking


def _check(shape: str, payload: dict[str, Any], window: int | None = None) -> Refusal | None:
    return strict.check(shape, payload, orjson.dumps(payload), window=window)


def _refused(shape: str, payload: dict[str, Any], rule: str) -> Refusal:
    refusal = _check(shape, payload)
    assert refusal is not None, f"expected {rule}"
    assert (refusal.status, refusal.rule) == (400, rule), refusal
    error = orjson.loads(refusal.body)
    if shape == "anthropic":
        assert error["type"] == "error" and error["request_id"].startswith("req_")
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"] == refusal.message
    return refusal


def _user(*blocks: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks) if blocks else "hi"}


def _assistant(*blocks: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _text(text: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


def _use(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "read_file", "input": {}}


def _result(tool_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": "done", **extra}


def _thinking(text: str = "let me think") -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": SIG(text)}


def _messages(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": list(messages), **extra}


# --------------------------------------------------------------------------- captured


def _captured() -> list[Path]:
    return sorted(p for p in FIXTURES.glob("*/captured-requests/*.json")
                  if isinstance(json.loads(p.read_text()), dict)
                  and isinstance(json.loads(p.read_text()).get("body"), dict))


@pytest.mark.parametrize("path", _captured(), ids=lambda p: p.name)
def test_real_client_requests_are_accepted(path: Path) -> None:
    request = json.loads(path.read_text())
    route = request["path"].split("?")[0]
    shape = ("anthropic" if route == "/v1/messages"
             else "codex" if route.startswith("/backend-api/") else "responses")
    assert strict.check(shape, request["body"], orjson.dumps(request["body"]),
                        window=None) is None


def test_claude_code_shape_is_in_the_captured_set() -> None:
    """The case the rules must not break: a mid-conversation system message right
    after the first user message, adaptive thinking, a tool loop with no thinking."""
    name = "messages_after_unknown_recall_tool_use_request.json"
    path = FIXTURES / "claude-code" / "captured-requests" / name
    body = json.loads(path.read_text())["body"]
    assert [m["role"] for m in body["messages"]] == ["user", "system", "assistant", "user"]
    assert body["thinking"] == {"type": "adaptive"}


# --------------------------------------------------------------------------- Anthropic


def test_anthropic_valid_tool_loop_with_signed_thinking_is_accepted() -> None:
    payload = _messages(
        _user(_text("fix it")),
        {"role": "system", "content": "Available agents: none."},
        _assistant(_thinking(), _text("Reading."), _use("toolu_1")),
        _user(_result("toolu_1"), _text("and hurry")),
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert _check("anthropic", payload) is None


def test_anthropic_first_message_must_be_user() -> None:
    refusal = _refused("anthropic", _messages(_assistant(_text())), "anthropic.first_user")
    assert refusal.message == 'messages: first message must use the "user" role'


def test_anthropic_unknown_role_is_refused() -> None:
    payload = _messages(_user(), {"role": "tool", "content": "x"})
    refusal = _refused("anthropic", payload, "anthropic.role")
    assert refusal.message == "messages.1.role: Input should be 'user', 'assistant' or 'system'"


def test_anthropic_system_message_must_follow_a_user_message() -> None:
    ok = _messages(_user(), {"role": "system", "content": "a"},
                   {"role": "system", "content": [_text("b")]})
    assert _check("anthropic", ok) is None
    payload = _messages(_user(), _assistant(_text()), {"role": "system", "content": "late"})
    refusal = _refused("anthropic", payload, "anthropic.system_position")
    assert refusal.message == (
        'messages.2: a "system" message must immediately follow a "user" message')
    first = _messages({"role": "system", "content": "first"}, _user())
    _refused("anthropic", first, "anthropic.first_user")


def test_anthropic_tool_use_must_be_answered_first_in_the_next_message() -> None:
    unanswered = _messages(_user(), _assistant(_use("toolu_a"), _use("toolu_b")),
                           _user(_result("toolu_a")))
    refusal = _refused("anthropic", unanswered, "anthropic.tool_use_unanswered")
    assert refusal.message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately"
        " after: toolu_b. Each `tool_use` block must have a corresponding `tool_result`"
        " block in the next message.")
    text_first = _messages(_user(), _assistant(_use("toolu_a")),
                           _user(_text("first"), _result("toolu_a")))
    _refused("anthropic", text_first, "anthropic.tool_use_unanswered")
    trailing = _messages(_user(), _assistant(_text("calling"), _use("toolu_a")))
    _refused("anthropic", trailing, "anthropic.tool_use_unanswered")
    prefill = _messages(_user(), _assistant(_text("Sure,")))
    assert _check("anthropic", prefill) is None


def test_anthropic_tool_result_needs_its_tool_use_just_before() -> None:
    payload = _messages(_user(), _assistant(_use("toolu_a")),
                        _user(_result("toolu_a"), _result("toolu_gone")))
    refusal = _refused("anthropic", payload, "anthropic.tool_result_orphan")
    assert refusal.message == (
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks:"
        " toolu_gone. Each `tool_result` block must have a corresponding `tool_use` block"
        " in the previous message.")


def test_anthropic_tool_use_ids_are_unique() -> None:
    payload = _messages(_user(), _assistant(_use("toolu_a")), _user(_result("toolu_a")),
                        _assistant(_use("toolu_a")), _user(_result("toolu_a")))
    refusal = _refused("anthropic", payload, "anthropic.tool_use_duplicate")
    assert refusal.message == "messages.3.content.0: `tool_use` ids must be unique"


def test_anthropic_empty_content_and_text_are_refused() -> None:
    empty = _refused("anthropic", _messages(_user(), _assistant(), _user()),
                     "anthropic.empty_content")
    assert empty.message == ("messages.1: all messages must have non-empty content except"
                             " for the optional final assistant message")
    assert _check("anthropic", _messages(_user(), _assistant())) is None  # final: allowed
    text = _refused("anthropic", _messages(_user(_text("a"), _text(""))), "anthropic.empty_text")
    assert text.message == "messages.0.content.1: text content blocks must be non-empty"
    system = _messages(_user(), system=[_text("x"), _text("")])
    assert _refused("anthropic", system, "anthropic.empty_text").message == (
        "system.1: text content blocks must be non-empty")


def test_anthropic_thinking_signatures_must_verify() -> None:
    good = _messages(_user(), _assistant(_thinking("plan"), _text()), _user())
    assert _check("anthropic", good) is None
    forged = {"type": "thinking", "thinking": "plan", "signature": "EqQBCkYIBxgCKkB..."}
    refusal = _refused("anthropic", _messages(_user(), _assistant(forged, _text()), _user()),
                       "anthropic.thinking_signature")
    assert refusal.message == "messages.1.content.0: Invalid `signature` in `thinking` block"
    edited = {**_thinking("plan"), "thinking": "plan, edited"}
    _refused("anthropic", _messages(_user(), _assistant(edited, _text()), _user()),
             "anthropic.thinking_signature")
    redacted = {"type": "redacted_thinking", "data": strict.seal_redacted("secret")}
    assert _check("anthropic", _messages(_user(), _assistant(redacted, _text()))) is None
    bad = {"type": "redacted_thinking", "data": "opaque"}
    _refused("anthropic", _messages(_user(), _assistant(bad, _text())),
             "anthropic.thinking_signature")
    in_user = _messages(_user(_thinking(), _text()))
    _refused("anthropic", in_user, "anthropic.thinking_role")


def test_anthropic_thinking_must_start_the_final_tool_loop_turn() -> None:
    loop = (_user(_text("go")), _assistant(_text("Reading."), _use("toolu_1")),
            _user(_result("toolu_1")))
    enabled = {"type": "enabled", "budget_tokens": 1024}
    refusal = _refused("anthropic", _messages(*loop, thinking=enabled),
                       "anthropic.thinking_first")
    assert refusal.message.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found"
        " `text`. When `thinking` is enabled, a final `assistant` message must start with a"
        " thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks).")
    assert _check("anthropic", _messages(*loop)) is None  # thinking off
    assert _check("anthropic", _messages(*loop, thinking={"type": "disabled"})) is None
    # Adaptive: the model decides per reply whether to think, so a turn may open
    # without thinking and think later; only ``enabled`` demands the opening block.
    assert _check("anthropic", _messages(*loop, thinking={"type": "adaptive"})) is None
    late = (_user(_text("go")), _assistant(_use("toolu_1")), _user(_result("toolu_1")),
            _assistant(_thinking(), _use("toolu_2")), _user(_result("toolu_2")))
    assert _check("anthropic", _messages(*late, thinking={"type": "adaptive"})) is None
    _refused("anthropic", _messages(*late, thinking=enabled), "anthropic.thinking_first")
    # The turn's first assistant message starting with thinking satisfies it; so does a
    # new user turn (not a tool loop).
    thought = (_user(_text("go")), _assistant(_thinking(), _use("toolu_1")),
               _user(_result("toolu_1")), _assistant(_use("toolu_2")), _user(_result("toolu_2")))
    assert _check("anthropic", _messages(*thought, thinking=enabled)) is None
    new_turn = (*loop, _assistant(_text("Done.")), _user(_text("thanks")))
    assert _check("anthropic", _messages(*new_turn, thinking=enabled)) is None


def test_anthropic_at_most_four_cache_breakpoints() -> None:
    marker = {"type": "ephemeral"}
    four = _messages(_user(_text("a", cache_control=marker), _text("b", cache_control=marker)),
                     system=[_text("s", cache_control=marker)],
                     tools=[{"name": "t", "input_schema": {}, "cache_control": marker}])
    assert _check("anthropic", four) is None
    five = {**four, "cache_control": marker}
    refusal = _refused("anthropic", five, "anthropic.cache_control_limit")
    assert refusal.message == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    nested = _messages(_user(), _assistant(_use("toolu_1")),
                       _user({**_result("toolu_1", cache_control=marker),
                              "content": [_text("x", cache_control=marker)] * 4}))
    _refused("anthropic", nested, "anthropic.cache_control_limit")


def test_anthropic_a_1h_breakpoint_must_not_follow_a_5m_one() -> None:
    long, short = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}
    ordered = _messages(_user(_text("a", cache_control=short)),
                        system=[_text("s", cache_control=long)])
    assert _check("anthropic", ordered) is None
    reversed_ = _messages(_user(_text("a", cache_control=long)),
                          system=[_text("s", cache_control={**short, "ttl": "5m"})])
    refusal = _refused("anthropic", reversed_, "anthropic.ttl_order")
    assert refusal.message == (
        "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block."
        " Note that the order of cache_control blocks is: tools, system, messages.")
    tools_first = _messages(_user(), tools=[{"name": "t", "input_schema": {},
                                             "cache_control": short}],
                            system=[_text("s", cache_control=long)])
    _refused("anthropic", tools_first, "anthropic.ttl_order")


# --------------------------------------------------------------------------- Responses


def _inputs(*items: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-5.1-codex", "stream": True, "input": list(items)}


def _msg(role: str, text: str = "hi") -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _call(call_id: str, item_id: str | None = None) -> dict[str, Any]:
    item = {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": "{}"}
    return {**item, "id": item_id} if item_id else item


def _output(call_id: str, kind: str = "function_call_output") -> dict[str, Any]:
    return {"type": kind, "call_id": call_id, "output": "ok"}


def _reasoning(item_id: str, sealed: bool = True) -> dict[str, Any]:
    content = strict.seal_reasoning(item_id, "thought") if sealed else "gAAAAABforged=="
    return {"type": "reasoning", "id": item_id, "summary": [], "encrypted_content": content}


@pytest.mark.parametrize("shape", ["responses", "codex"])
def test_responses_valid_tool_loop_is_accepted(shape: str) -> None:
    payload = _inputs(_msg("developer"), _msg("user"), _reasoning("rs_1"), _call("c1", "fc_1"),
                      _output("c1"), _reasoning("rs_2"), _msg("assistant", "done"))
    assert _check(shape, payload) is None
    assert _check(shape, {"model": "gpt-5", "input": "a string input"}) is None


def test_responses_output_needs_an_earlier_call() -> None:
    refusal = _refused("responses", _inputs(_msg("user"), _output("call_x")),
                       "responses.orphan_output")
    assert refusal.message == "No tool call found for function call output with call_id call_x."
    error = orjson.loads(refusal.body)["error"]
    assert (error["param"], error["code"]) == ("input", None)
    custom = _inputs(_msg("user"), _output("call_y", "custom_tool_call_output"))
    _refused("codex", custom, "responses.orphan_output")
    late = _inputs(_msg("user"), _output("c1"), _call("c1"))
    _refused("responses", late, "responses.orphan_output")


def test_responses_reasoning_needs_its_following_item() -> None:
    alone = _inputs(_msg("user"), _reasoning("rs_1"), _msg("user", "next"))
    refusal = _refused("responses", alone, "responses.reasoning_alone")
    assert refusal.message == (
        "Item 'rs_1' of type 'reasoning' was provided without its required following item.")
    _refused("responses", _inputs(_msg("user"), _reasoning("rs_1")), "responses.reasoning_alone")
    chained = _inputs(_msg("user"), _reasoning("rs_1"), _reasoning("rs_2"), _call("c", "fc"),
                      _output("c"))
    assert _check("responses", chained) is None


def test_responses_encrypted_content_must_verify() -> None:
    forged = _inputs(_msg("user"), _reasoning("rs_1", sealed=False), _msg("assistant"))
    refusal = _refused("responses", forged, "responses.encrypted_content")
    assert refusal.message == "The encrypted content for item rs_1 could not be verified."
    assert orjson.loads(refusal.body)["error"]["code"] == "invalid_encrypted_content"
    fake_own = {"type": "compaction", "id": "cmp_1", "encrypted_content": FAKE_ENCRYPTED}
    assert _check("codex", _inputs(fake_own, _msg("user"))) is None
    sealed = {"type": "compaction", "encrypted_content": strict.seal_reasoning("cmp", "s")}
    assert _check("codex", _inputs(sealed, _msg("user"))) is None
    other = {"type": "compaction", "encrypted_content": "gAAAAAB0123456789"}
    refusal = _refused("codex", _inputs(other, _msg("user")), "responses.encrypted_content")
    assert refusal.message == "The encrypted content gAAA...6789 could not be verified."


def test_responses_lore_compaction_handle_must_never_reach_upstream() -> None:
    handle = {"type": "compaction", "id": "cmp_lore_1",
              "encrypted_content": "lore-compaction:v1:abc123"}
    refusal = _refused("codex", _inputs(handle, _msg("user")), "responses.encrypted_content")
    assert refusal.message == "The encrypted content for item cmp_lore_1 could not be verified."


def test_responses_item_ids_are_unique() -> None:
    payload = _inputs(_msg("user"), _call("c1", "fc_1"), _output("c1"), _call("c2", "fc_1"),
                      _output("c2"))
    refusal = _refused("responses", payload, "responses.duplicate_id")
    assert refusal.message == ("Duplicate item found with id fc_1. Remove duplicate items from"
                               " your input and try again.")


# --------------------------------------------------------------------------- Chat


def _chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages)}


def _asks(*ids: str) -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
             for i in ids]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def test_chat_valid_tool_loop_is_accepted() -> None:
    payload = _chat({"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                    _asks("a", "b"), _tool("a"), _tool("b"),
                    {"role": "assistant", "content": "done"})
    assert _check("chat", payload) is None


def test_chat_tool_message_must_answer_a_tool_call() -> None:
    refusal = _refused("chat", _chat({"role": "user", "content": "u"}, _tool("a")),
                       "chat.tool_orphan")
    assert refusal.message == ("Invalid parameter: messages with role 'tool' must be a response"
                               " to a preceeding message with 'tool_calls'.")
    assert orjson.loads(refusal.body)["error"]["param"] == "messages.[1].role"
    wrong = _chat({"role": "user", "content": "u"}, _asks("a"), _tool("a"), _tool("z"))
    _refused("chat", wrong, "chat.tool_orphan")


def test_chat_every_tool_call_is_answered() -> None:
    payload = _chat({"role": "user", "content": "u"}, _asks("a", "b"), _tool("a"),
                    {"role": "user", "content": "next"})
    refusal = _refused("chat", payload, "chat.tool_calls_unanswered")
    assert refusal.message == (
        "An assistant message with 'tool_calls' must be followed by tool messages responding"
        " to each 'tool_call_id'. The following tool_call_ids did not have response"
        " messages: b")


# --------------------------------------------------------------------------- window


def test_window_counts_body_bytes_over_four() -> None:
    assert strict.BYTES_PER_TOKEN == 4 and strict.estimate_tokens(b"x" * 4003) == 1000
    assert strict.window_for_model("claude-sonnet-4-5") == 200_000
    assert strict.window_for_model("gpt-5.1-codex") == 272_000


@pytest.mark.parametrize("shape", ["anthropic", "responses", "codex", "chat"])
def test_window_overflow_is_the_providers_error(shape: str) -> None:
    payload: dict[str, Any] = ({"model": "claude-x", "messages": [_user(_text("x" * 4000))]}
                               if shape == "anthropic"
                               else {"model": "gpt-5", "messages" if shape == "chat" else "input":
                                     [{"role": "user", "content": "x" * 4000}]})
    body = orjson.dumps(payload)
    tokens = len(body) // 4
    assert strict.check(shape, payload, body, window=tokens) is None
    refusal = strict.check(shape, payload, body, window=tokens - 1)
    assert refusal is not None and (refusal.status, refusal.rule) == (400, "window")
    error = orjson.loads(refusal.body)["error"]
    if shape == "anthropic":
        assert refusal.message == f"prompt is too long: {tokens} tokens > {tokens - 1} maximum"
    else:
        assert error["code"] == "context_length_exceeded"
        assert refusal.message == (f"This model's maximum context length is {tokens - 1} tokens."
                                   f" However, your messages resulted in {tokens} tokens.")


def test_window_defaults_to_the_models() -> None:
    payload = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 600_000}]}
    refusal = _check("chat", payload)
    assert refusal is not None and refusal.rule == "window" and "128000 tokens" in refusal.message
    assert _check("chat", {**payload, "model": "gpt-4.1"}) is None


def test_shape_rules_come_before_the_window() -> None:
    payload = _messages(_assistant(_text("x" * 1000)))
    refusal = _check("anthropic", payload, window=10)
    assert refusal is not None and refusal.rule == "anthropic.first_user"


# --------------------------------------------------------------------------- the fake
# Plain blocking HTTP: the fake runs in its own thread, and these tests need no
# event loop of their own (the browser tests before them leave one running).


def _post(fake: FakeUpstream, body: dict[str, Any],
          **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(fake.url + "/v1/messages", data=orjson.dumps(body),
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_fake_upstream_answers_a_violation_and_lists_it(fake_upstream: FakeUpstream) -> None:
    assert fake_upstream.strict and not fake_upstream.refusals
    body = _messages(_user(), _assistant(_use("toolu_1")), _user(_text("no result")))
    status, headers, raw = _post(fake_upstream, body)
    assert status == 400 and headers["request-id"].startswith("req_fake_")
    error = orjson.loads(raw)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    ((path, refusal),) = fake_upstream.refusals
    assert path == "/v1/messages" and refusal.rule == "anthropic.tool_use_unanswered"
    assert error["error"]["message"] == refusal.message

    fake_upstream.strict = False  # this test's point: the same request, strict mode off
    assert _post(fake_upstream, body)[0] == 200
    assert len(fake_upstream.refusals) == 1
    fake_upstream.reset()
    assert fake_upstream.strict and not fake_upstream.refusals


def test_fake_upstreams_own_thinking_answer_passes_strict_mode(
        fake_upstream: FakeUpstream) -> None:
    """The fake signs its thinking blocks, so a client that sends them back is accepted."""
    first = _messages(_user(_text("what did we decide?")), thinking={"type": "enabled"})
    status, _, raw = _post(fake_upstream, first, **{"x-fake-scenario": "thinking-recall"})
    content = orjson.loads(raw)["content"]
    assert status == 200 and content[0]["type"] == "thinking"
    call = next(b for b in content if b["type"] == "tool_use")
    follow = {**first, "messages": [*first["messages"], _assistant(*content),
                                    _user(_result(call["id"]))]}
    status, _, raw = _post(fake_upstream, follow)
    assert status == 200, raw
    assert not fake_upstream.refusals


def test_fake_window_is_the_agents_and_workers_meet_their_models(
        fake_upstream: FakeUpstream) -> None:
    fake_upstream.window = 50
    fake_upstream.worker_scenario = "text"
    body = _messages(_user(_text("x" * 400)))
    assert _post(fake_upstream, body)[0] == 400
    assert _post(fake_upstream, body, **{"x-lore-worker": "distill"})[0] == 200
    assert [r.rule for _, r in fake_upstream.refusals] == ["window"]


def test_the_fake_never_repeats_a_tool_id_within_a_conversation(
        fake_upstream: FakeUpstream) -> None:
    """Its ids come from content; the same call three times still gets three ids."""
    history: list[dict[str, Any]] = [_user(_text("read it"))]
    ids = []
    for _ in range(3):
        status, _, raw = _post(fake_upstream, _messages(*history),
                               **{"x-fake-scenario": 'tool:read_file {"path": "a.txt"}'})
        assert status == 200, raw
        content = orjson.loads(raw)["content"]
        ids.append(content[-1]["id"])
        history += [_assistant(*content), _user(_result(content[-1]["id"]))]
    assert len(set(ids)) == 3 and not fake_upstream.refusals
    assert _post(fake_upstream, _messages(*history))[0] == 200
