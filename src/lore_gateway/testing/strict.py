"""The fake provider's strict mode: refuse what the real APIs refuse.

A fake that accepts any request lets context-management bugs through that the
real providers answer with a 400 and a dead session: a thinking block whose
signature no longer matches, a ``tool_result`` whose ``tool_use`` was dropped,
a fifth cache breakpoint, a reasoning item cut from the call that follows it.
``check`` looks at a request as the provider would and returns the provider's
own refusal (status, error body in its shape, message in its words), or None.

Pure: plain data in, a :class:`Refusal` out, no IO. ``fake_upstream`` calls it
for every model request unless a test turns strict mode off.

Rules run in a fixed order per shape and the first refusal wins, as the real
APIs report one error at a time. Shape rules come before the context window,
as validation precedes tokenising. The messages are the providers' wording as
real error bodies show it (typos included, e.g. "preceeding"); the few cases
no real body was seen for say so beside their rule.

The window check counts tokens as ``estimate_tokens`` does (body bytes / 4,
the estimate metered mode uses), against the fake's ``window`` or the model's
(``window_for_model``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.context.windows import window_for
from lore_gateway.testing.fake_compaction import FAKE_ENCRYPTED
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN, overflow_body
from lore_gateway.testing.fake_seals import (
    reasoning_verifies,
    redacted_verifies,
    seal_reasoning,
    seal_redacted,
    sign_thinking,
    thinking_verifies,
)

__all__ = [
    "BYTES_PER_TOKEN",
    "SHAPES",
    "Refusal",
    "check",
    "check_window",
    "estimate_tokens",
    "seal_reasoning",
    "seal_redacted",
    "sign_thinking",
    "window_for_model",
]

SHAPES = ("anthropic", "responses", "codex", "chat")
# Anthropic counts at most this many cache breakpoints in one request.
MAX_CACHE_MARKERS = 4
# The gateway's own compaction handle (compaction/answers.py HANDLE_PREFIX, any
# version): it stands in for a summary the gateway keeps and means nothing to
# the provider, so one that reaches upstream is a gateway bug.
LORE_HANDLE_PREFIX = "lore-compaction:"
# Shown of an id-less encrypted value in the error, as OpenAI shows "gAAA...DQ==".
_SHOWN_CHARS = 4

_ROLES = ("user", "assistant", "system")
_THINKING = ("thinking", "redacted_thinking")
_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
_USER_SIDE_ROLES = ("user", "system", "developer")


@dataclass(frozen=True, slots=True)
class Refusal:
    """The provider's answer to a request it refuses."""

    status: int  # HTTP status the provider answers
    body: bytes  # the provider's error JSON, in its own shape
    rule: str  # short stable id, e.g. "anthropic.thinking_first", "window"
    message: str  # the error message text


def estimate_tokens(body: bytes) -> int:
    """Tokens of a request as the fake counts them: body bytes / 4 (as metered mode)."""
    return len(body) // BYTES_PER_TOKEN


def window_for_model(model: str) -> int:
    """The model's context window in tokens (the gateway's own table)."""
    return window_for(model)


def check(shape: str, payload: Any, body: bytes, *, window: int | None) -> Refusal | None:
    """The provider's refusal of this request, or None when it would accept it.

    ``shape`` is the route's (``anthropic``, ``responses``, ``codex``, ``chat``),
    ``payload`` the parsed JSON of ``body``; ``window`` defaults to the model's.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}")
    if not isinstance(payload, dict):
        return None  # the fake answers an unparsable body itself
    rules = {"anthropic": ANTHROPIC_RULES, "chat": CHAT_RULES}.get(shape, RESPONSES_RULES)
    for rule in rules:
        refusal = rule(payload)
        if refusal is not None:
            return refusal
    if window is None:
        model = payload.get("model")
        window = window_for_model(model if isinstance(model, str) else "")
    return check_window(shape, body, window)


def check_window(shape: str, body: bytes, window: int) -> Refusal | None:
    """The provider's context-length error when ``body`` exceeds ``window`` tokens."""
    tokens = estimate_tokens(body)
    if tokens <= window:
        return None
    error = overflow_body(shape, tokens, window)
    return Refusal(400, error, "window", orjson.loads(error)["error"]["message"])


# --------------------------------------------------------------------------- bodies


def _anthropic(rule: str, message: str) -> Refusal:
    # The request id is derived from the message so equal requests give equal bytes.
    request_id = "req_fakestrict" + hashlib.sha1(message.encode()).hexdigest()[:20]
    body = orjson.dumps({"type": "error", "error": {
        "type": "invalid_request_error", "message": message}, "request_id": request_id})
    return Refusal(400, body, rule, message)


def _openai(rule: str, message: str, param: str | None, code: str | None = None) -> Refusal:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error",
                                   "param": param, "code": code}})
    return Refusal(400, body, rule, message)


# --------------------------------------------------------------------------- Anthropic

_Rule = Callable[[dict[str, Any]], Refusal | None]


def _messages(payload: dict[str, Any]) -> list[Any]:
    messages = payload.get("messages")
    return messages if isinstance(messages, list) else []


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _blocks(message: Any) -> list[dict[str, Any]]:
    """A message's content blocks (a string content has none to inspect)."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict)]


def _first_type(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return "text"
    blocks = _blocks(message)
    return str(blocks[0].get("type")) if blocks else "none"


def _tool_use_ids(message: Any) -> list[str]:
    return [str(b.get("id")) for b in _blocks(message) if b.get("type") == "tool_use"]


def _roles(payload: dict[str, Any]) -> Refusal | None:
    for i, message in enumerate(_messages(payload)):
        if _role(message) not in _ROLES:
            return _anthropic("anthropic.role", f"messages.{i}.role: Input should be"
                              " 'user', 'assistant' or 'system'")
    return None


def _first_user(payload: dict[str, Any]) -> Refusal | None:
    messages = _messages(payload)
    if messages and _role(messages[0]) != "user":
        return _anthropic("anthropic.first_user",
                          'messages: first message must use the "user" role')
    return None


def _system_messages(payload: dict[str, Any]) -> Refusal | None:
    """Mid-conversation system messages: right after a user message (or after such a
    system message), holding text only."""
    messages = _messages(payload)
    for i, message in enumerate(messages):
        if _role(message) != "system":
            continue
        if i == 0 or _role(messages[i - 1]) not in ("user", "system"):
            return _anthropic("anthropic.system_position",
                              f'messages.{i}: a "system" message must immediately follow'
                              ' a "user" message')
        for j, block in enumerate(_blocks(message)):
            if block.get("type") != "text":  # our wording: no real body seen
                return _anthropic("anthropic.system_content",
                                  f"messages.{i}.content.{j}.type: a \"system\" message"
                                  " may only hold text blocks")
    return None


def _empty_content(payload: dict[str, Any]) -> Refusal | None:
    messages = _messages(payload)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        prefill = i == len(messages) - 1 and _role(message) == "assistant"
        if content in ("", []) and not prefill:
            return _anthropic("anthropic.empty_content",
                              f"messages.{i}: all messages must have non-empty content except"
                              " for the optional final assistant message")
    return None


def _empty_texts(blocks: list[dict[str, Any]], where: str) -> str | None:
    """The path of the first empty text block, nested tool results included."""
    for j, block in enumerate(blocks):
        if block.get("type") == "text" and block.get("text") == "":
            return f"{where}.{j}"
        inner = block.get("content")
        if block.get("type") == "tool_result" and isinstance(inner, list):
            found = _empty_texts([b for b in inner if isinstance(b, dict)],
                                 f"{where}.{j}.content")
            if found is not None:
                return found
    return None


def _empty_text(payload: dict[str, Any]) -> Refusal | None:
    system = payload.get("system")
    places: list[tuple[list[dict[str, Any]], str]] = []
    if isinstance(system, list):
        places.append(([b for b in system if isinstance(b, dict)], "system"))
    places += [(_blocks(m), f"messages.{i}.content") for i, m in enumerate(_messages(payload))]
    for blocks, where in places:
        found = _empty_texts(blocks, where)
        if found is not None:
            return _anthropic("anthropic.empty_text",
                              f"{found}: text content blocks must be non-empty")
    return None


def _thinking_blocks(payload: dict[str, Any]) -> Refusal | None:
    """Thinking blocks only in assistant messages, each signed by the fake."""
    for i, message in enumerate(_messages(payload)):
        for j, block in enumerate(_blocks(message)):
            kind = block.get("type")
            if kind not in _THINKING:
                continue
            if _role(message) != "assistant":  # our wording: no real body seen
                return _anthropic("anthropic.thinking_role",
                                  f"messages.{i}.content.{j}.type: `{kind}` blocks are only"
                                  " allowed in `assistant` messages")
            if kind == "thinking" and not thinking_verifies(block.get("thinking"),
                                                            block.get("signature")):
                return _anthropic("anthropic.thinking_signature",
                                  f"messages.{i}.content.{j}: Invalid `signature` in"
                                  " `thinking` block")
            if kind == "redacted_thinking" and not redacted_verifies(block.get("data")):
                return _anthropic("anthropic.thinking_signature",
                                  f"messages.{i}.content.{j}: Invalid `data` in"
                                  " `redacted_thinking` block")
    return None


def _unique_tool_ids(payload: dict[str, Any]) -> Refusal | None:
    seen: set[str] = set()
    for i, message in enumerate(_messages(payload)):
        for j, block in enumerate(_blocks(message)):
            if block.get("type") != "tool_use":
                continue
            tool_id = str(block.get("id"))
            if tool_id in seen:
                return _anthropic("anthropic.tool_use_duplicate",
                                  f"messages.{i}.content.{j}: `tool_use` ids must be unique")
            seen.add(tool_id)
    return None


def _leading_results(message: Any) -> list[str]:
    """The tool_use ids a message answers: its tool_result blocks before any other."""
    ids: list[str] = []
    for block in _blocks(message):
        if block.get("type") != "tool_result":
            break
        ids.append(str(block.get("tool_use_id")))
    return ids


def _tool_pairs(payload: dict[str, Any]) -> Refusal | None:
    """Each tool_use answered first thing in the next (user) message; each tool_result
    answering a tool_use of the message just before."""
    messages = _messages(payload)
    for i, message in enumerate(messages):
        if _role(message) == "assistant":
            after = messages[i + 1] if i + 1 < len(messages) else None
            answered = _leading_results(after) if _role(after) == "user" else []
            missing = [t for t in _tool_use_ids(message) if t not in answered]
            if missing:
                return _anthropic(
                    "anthropic.tool_use_unanswered",
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks"
                    f" immediately after: {', '.join(missing)}. Each `tool_use` block must"
                    " have a corresponding `tool_result` block in the next message.")
            continue
        before = messages[i - 1] if i > 0 else None
        called = _tool_use_ids(before) if _role(before) == "assistant" else []
        for j, block in enumerate(_blocks(message)):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in called:
                return _anthropic(
                    "anthropic.tool_result_orphan",
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in"
                    f" `tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result`"
                    " block must have a corresponding `tool_use` block in the previous"
                    " message.")
    return None


def _tool_results_only(message: Any) -> bool:
    """A user message answering tool calls: tool results, perhaps then text."""
    blocks = _blocks(message)
    return (_role(message) == "user" and bool(blocks) and blocks[0].get("type") == "tool_result"
            and all(b.get("type") in ("tool_result", "text") for b in blocks))


def _thinking_first(payload: dict[str, Any]) -> Refusal | None:
    """With thinking enabled, a tool loop's final assistant turn starts with a
    thinking block: the turn is everything after the last user message that is
    not tool results, so a history cut inside a turn and reopened by a user
    message must start its tail with a round that thought.

    Only ``enabled`` (the API's own words): under ``adaptive`` the model decides
    per reply whether to think, so a faithful history may open a turn without
    thinking and think later in it, and the API cannot demand what its model
    did not produce.
    """
    config = payload.get("thinking")
    kind = config.get("type") if isinstance(config, dict) else None
    if kind != "enabled":
        return None
    turns = [(i, m) for i, m in enumerate(_messages(payload)) if _role(m) != "system"]
    if not turns or not _tool_results_only(turns[-1][1]):
        return None
    start = max((i for i, m in turns if _role(m) == "user" and not _tool_results_only(m)),
                default=-1)
    final = [(i, m) for i, m in turns if i > start and _role(m) == "assistant"]
    if not final:
        return None
    first, message = final[0]
    found = _first_type(message)
    if found in _THINKING:
        return None
    return _anthropic(
        "anthropic.thinking_first",
        f"messages.{first}.content.0.type: Expected `thinking` or `redacted_thinking`, but"
        f" found `{found}`. When `thinking` is enabled, a final `assistant` message must start"
        " with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result`"
        " blocks). We recommend you include thinking blocks from previous turns. To avoid"
        " this requirement, disable `thinking`. Please consult our documentation at"
        f" {_THINKING_DOCS}")


def _cache_ttls(payload: dict[str, Any]) -> Iterator[str]:
    """The TTL of every cache breakpoint, in Anthropic's processing order: tools,
    system, messages (tool results' inner blocks included), then the top-level one."""

    def marked(blocks: Any) -> Iterator[str]:
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict):
                continue
            marker = block.get("cache_control")
            if isinstance(marker, dict):
                yield str(marker.get("ttl") or "5m")
            if block.get("type") == "tool_result":
                yield from marked(block.get("content"))

    yield from marked(payload.get("tools"))
    yield from marked(payload.get("system"))
    for message in _messages(payload):
        yield from marked(message.get("content") if isinstance(message, dict) else None)
    top = payload.get("cache_control")
    if isinstance(top, dict):
        yield str(top.get("ttl") or "5m")


def _cache_control_count(payload: dict[str, Any]) -> Refusal | None:
    found = sum(1 for _ in _cache_ttls(payload))
    if found > MAX_CACHE_MARKERS:
        return _anthropic("anthropic.cache_control_limit",
                          f"A maximum of {MAX_CACHE_MARKERS} blocks with cache_control may be"
                          f" provided. Found {found}.")
    return None


def _ttl_order(payload: dict[str, Any]) -> Refusal | None:
    short_seen = False
    for ttl in _cache_ttls(payload):
        if ttl == "1h" and short_seen:
            return _anthropic("anthropic.ttl_order",
                              "a ttl='1h' cache_control block must not come after a ttl='5m'"
                              " cache_control block. Note that the order of cache_control"
                              " blocks is: tools, system, messages.")
        short_seen = short_seen or ttl != "1h"
    return None


ANTHROPIC_RULES: tuple[_Rule, ...] = (
    _roles, _first_user, _system_messages, _empty_content, _empty_text, _thinking_blocks,
    _unique_tool_ids, _tool_pairs, _thinking_first, _cache_control_count, _ttl_order,
)


# --------------------------------------------------------------------------- Responses


def _items(payload: dict[str, Any]) -> list[dict[str, Any]]:
    items = payload.get("input")
    if not isinstance(items, list):
        return []  # a string input is one user message
    return [item for item in items if isinstance(item, dict)]


def _duplicate_ids(payload: dict[str, Any]) -> Refusal | None:
    seen: set[str] = set()
    for item in _items(payload):
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            continue
        if item_id in seen:
            return _openai("responses.duplicate_id",
                           f"Duplicate item found with id {item_id}. Remove duplicate items"
                           " from your input and try again.", "input")
        seen.add(item_id)
    return None


def _orphan_outputs(payload: dict[str, Any]) -> Refusal | None:
    """Every tool output answers a call with its ``call_id`` earlier in the input."""
    calls: set[Any] = set()
    for item in _items(payload):
        kind = str(item.get("type") or "")
        if kind.endswith("_call_output"):
            if item.get("call_id") not in calls:
                return _openai("responses.orphan_output",
                               "No tool call found for function call output with call_id"
                               f" {item.get('call_id')}.", "input")
        elif kind.endswith("_call"):
            calls.add(item.get("call_id"))
    return None


def _user_side(item: dict[str, Any]) -> bool:
    """An item the client wrote (input, a tool output), not one the model produced."""
    kind = str(item.get("type") or "message")
    return (item.get("role") in _USER_SIDE_ROLES or kind.endswith("_output")
            or kind.startswith("compaction"))


def _reasoning_followed(payload: dict[str, Any]) -> Refusal | None:
    """A reasoning item comes with the output it led to (after any more reasoning)."""
    items = _items(payload)
    for index, item in enumerate(items):
        if item.get("type") != "reasoning":
            continue
        after = index + 1
        while after < len(items) and items[after].get("type") == "reasoning":
            after += 1
        if after == len(items) or _user_side(items[after]):
            return _openai("responses.reasoning_alone",
                           f"Item '{item.get('id')}' of type 'reasoning' was provided without"
                           " its required following item.", "input")
    return None


def _sealed_ok(item: dict[str, Any]) -> bool:
    value = item.get("encrypted_content")
    if item.get("type") == "reasoning":
        return value is None or reasoning_verifies(value)
    if isinstance(value, str) and value.startswith(LORE_HANDLE_PREFIX):
        return False
    return value is None or value == FAKE_ENCRYPTED or reasoning_verifies(value)


def _encrypted_content(payload: dict[str, Any]) -> Refusal | None:
    """Reasoning and compaction items carry content the fake sealed (never a lore handle)."""
    for item in _items(payload):
        if item.get("type") not in ("reasoning", "compaction") or _sealed_ok(item):
            continue
        item_id = item.get("id")
        if isinstance(item_id, str) and item_id:
            message = f"The encrypted content for item {item_id} could not be verified."
        else:
            value = str(item.get("encrypted_content"))
            shown = f"{value[:_SHOWN_CHARS]}...{value[-_SHOWN_CHARS:]}"
            message = f"The encrypted content {shown} could not be verified."
        return _openai("responses.encrypted_content", message, None,
                       "invalid_encrypted_content")
    return None


RESPONSES_RULES: tuple[_Rule, ...] = (
    _duplicate_ids, _orphan_outputs, _reasoning_followed, _encrypted_content,
)


# --------------------------------------------------------------------------- Chat


def _call_ids(message: Any) -> list[str]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list):
        return []
    return [str(c.get("id")) for c in calls if isinstance(c, dict)]


def _chat_tools(payload: dict[str, Any]) -> Refusal | None:
    """Tool messages answer the assistant's tool calls, all of them, right after it."""
    messages = _messages(payload)
    for i, message in enumerate(messages):
        if _role(message) == "assistant" and _call_ids(message):
            after = i + 1
            answered: set[Any] = set()
            while after < len(messages) and _role(messages[after]) == "tool":
                answered.add(messages[after].get("tool_call_id"))
                after += 1
            missing = [c for c in _call_ids(message) if c not in answered]
            if missing:
                return _openai("chat.tool_calls_unanswered",
                               "An assistant message with 'tool_calls' must be followed by tool"
                               " messages responding to each 'tool_call_id'. The following"
                               f" tool_call_ids did not have response messages:"
                               f" {', '.join(missing)}", f"messages.[{i}].role")
        if _role(message) != "tool":
            continue
        caller = i - 1
        while caller >= 0 and _role(messages[caller]) == "tool":
            caller -= 1
        if caller < 0 or not _call_ids(messages[caller]):
            return _openai("chat.tool_orphan",
                           "Invalid parameter: messages with role 'tool' must be a response to"
                           " a preceeding message with 'tool_calls'.", f"messages.[{i}].role")
        if message.get("tool_call_id") not in _call_ids(messages[caller]):
            return _openai("chat.tool_orphan",
                           f"Invalid parameter: 'tool_call_id' of '{message.get('tool_call_id')}'"
                           " not found in 'tool_calls' of previous message.",
                           f"messages.[{i}].tool_call_id")
    return None


CHAT_RULES: tuple[_Rule, ...] = (_chat_tools,)
