"""Each protocol's conversation history, as the context planner needs it (pure).

The planner works on the list of history items (Anthropic and Chat
``messages``, Responses ``input``) by index. This module answers, per protocol:
which items lead (system/developer instructions that stay put), where a raw
tail may start without orphaning a tool call or result, how a tool output is
stripped, what the distilled prefix looks like, and the repairs at the boundary.
Everything here returns new objects and never mutates its input.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.routing import Family

Item = dict[str, Any]

# Tool outputs shorter than this stay whole even on stripping layers: a stub
# would save little and lose the whole output.
STRIP_MIN_CHARS = 600
# What a stripped output keeps of its head (a file path, an error line).
STRIP_KEEP_CHARS = 240
# The emergency layer truncates single tool outputs longer than this (head and
# tail kept), so one huge output cannot overflow the window by itself.
EMERGENCY_OUTPUT_CHARS = 24_000
# Anthropic allows 4 cache_control breakpoints per request.
MAX_BREAKPOINTS = 4
PREFIX_ACK = "Understood. I have the earlier session history above and can recall details."
REQUEST_HEAD = "[lore-gateway] The user's current request (its work continues below):"


def items_key(family: Family) -> str:
    return "input" if family is Family.RESPONSES else "messages"


def lead_count(family: Family, items: list[Any]) -> int:
    """Leading system/developer items (Chat, Responses): they stay in place."""
    if family is Family.ANTHROPIC:
        return 0
    count = 0
    for item in items:
        if not isinstance(item, dict) or item.get("role") not in ("system", "developer"):
            break
        count += 1
    return count


def is_user_text(family: Family, item: Any) -> bool:
    """A user message that is not a tool result: a real turn start."""
    if not isinstance(item, dict) or item.get("role") != "user":
        return False
    if family is Family.RESPONSES:
        return bool(item.get("type", "message") == "message")
    content = item.get("content")
    if family is Family.ANTHROPIC and isinstance(content, list):
        return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    return True


def is_tool_output(family: Family, item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    if family is Family.RESPONSES:
        return str(item.get("type", "")).endswith("_call_output")
    if family is Family.CHAT:
        return item.get("role") == "tool"
    content = item.get("content")
    return item.get("role") == "user" and isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def cut_points(family: Family, items: list[Any], lead: int, *,
               thinking: str | None = None) -> list[int]:
    """Indices where a raw tail may start: every call before has its result.

    A user turn start, or (mid-turn, in long agent loops) the first item of a
    new assistant round right after the previous round's tool outputs.

    ``thinking`` is Anthropic's thinking mode. A mid-turn tail is opened by a
    repeated user request, which makes its first assistant message the start of
    the final assistant turn, and with thinking ``enabled`` the API requires
    that to begin with a thinking block: only rounds that do are mid-turn cut
    points then. Under ``adaptive`` the model thinks only when it chooses, so
    a round that does not open with thinking may start the tail when no later
    round thinks either (the turn as sent is then one that did not think).
    """
    thinks_after = _thinking_suffix(items) if thinking == "adaptive" else []
    out: list[int] = []
    for index in range(lead + 1, len(items)):
        item, before = items[index], items[index - 1]
        new_round = (is_tool_output(family, before) and isinstance(item, dict)
                     and not is_tool_output(family, item) and _is_assistant_side(family, item))
        if new_round and thinking in ("enabled", "adaptive") and not starts_with_thinking(item):
            new_round = thinking == "adaptive" and not thinks_after[index]
        if new_round or is_user_text(family, item):
            out.append(index)
    return out


def _thinking_suffix(items: list[Any]) -> list[bool]:
    """For each index, whether any item from there on holds a thinking block."""
    out = [False] * (len(items) + 1)
    for index in range(len(items) - 1, -1, -1):
        content = items[index].get("content") if isinstance(items[index], dict) else None
        out[index] = out[index + 1] or (isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
            for b in content))
    return out


def thinking_mode(family: Family, payload: dict[str, Any]) -> str | None:
    """Anthropic extended thinking's type (``enabled``, ``adaptive``), or None."""
    config = payload.get("thinking") if family is Family.ANTHROPIC else None
    kind = config.get("type") if isinstance(config, dict) else None
    return kind if kind in ("enabled", "adaptive") else None


def starts_with_thinking(item: Any) -> bool:
    content = item.get("content") if isinstance(item, dict) else None
    return (isinstance(content, list) and bool(content) and isinstance(content[0], dict)
            and content[0].get("type") in ("thinking", "redacted_thinking"))


def is_system(family: Family, item: Any) -> bool:
    """A system (or developer) message inside the history: Anthropic's
    mid-conversation system messages, Chat and Responses instructions."""
    if not isinstance(item, dict):
        return False
    roles = ("system",) if family is Family.ANTHROPIC else ("system", "developer")
    if family is Family.RESPONSES and item.get("type", "message") != "message":
        return False
    return item.get("role") in roles


def _is_assistant_side(family: Family, item: Item) -> bool:
    if family is Family.RESPONSES:
        return item.get("role") == "assistant" or item.get("type") in (
            "function_call", "reasoning", "custom_tool_call", "local_shell_call")
    return item.get("role") == "assistant"


def starts_with_user(family: Family, item: Any) -> bool:
    return is_user_text(family, item)


def user_text(family: Family, item: Any) -> str:
    """The text of a user message (for the request a mid-turn cut leaves out)."""
    if not isinstance(item, dict):
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content
                         if isinstance(b, dict) and b.get("type") in ("text", "input_text"))
    return ""


def _stub(text: str, *, truncate_to: int | None = None) -> str:
    if truncate_to is not None:
        half = truncate_to // 2
        return (f"{text[:half]}\n[... {len(text) - truncate_to} characters cut by lore-gateway;"
                f" the full output is in memory (recall) ...]\n{text[-half:]}")
    lines = text.count("\n") + 1
    return (f"{text[:STRIP_KEEP_CHARS]}\n[tool output of {len(text)} characters, {lines} lines,"
            " removed by lore-gateway to save context; recall finds it]")


def _shrink(text: str, truncate_to: int | None) -> str | None:
    """The stripped (or truncated) form of one output text; None to keep it."""
    if truncate_to is not None:
        return _stub(text, truncate_to=truncate_to) if len(text) > truncate_to else None
    return _stub(text) if len(text) >= STRIP_MIN_CHARS else None


def strip_output(family: Family, item: Any, truncate_to: int | None = None) -> Any:
    """A tool-output item with its output replaced by a short stub (stripping
    layers) or cut to ``truncate_to`` characters (emergency); the item itself
    when it holds no output worth shrinking. Deterministic: the same item always
    gives the same bytes, so a stripped tail stays cache-stable."""
    if not is_tool_output(family, item):
        return item
    if family is Family.RESPONSES:
        output = item.get("output")
        if isinstance(output, str) and (new := _shrink(output, truncate_to)) is not None:
            return {**item, "output": new}
        return item
    if family is Family.CHAT:
        content = item.get("content")
        if isinstance(content, str) and (new := _shrink(content, truncate_to)) is not None:
            return {**item, "content": new}
        return item
    blocks = item["content"]
    changed = False
    out: list[Any] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            text = user_text(Family.ANTHROPIC, block) if isinstance(block.get("content"),
                                                                   list) else block.get("content")
            if isinstance(text, str) and (new := _shrink(text, truncate_to)) is not None:
                block = {**block, "content": new}
                changed = True
        out.append(block)
    return {**item, "content": out} if changed else item


def prefix_items(family: Family, text: str, *, request: str = "",
                 cache_ttl: str | None = None, breakpoint: bool = False,
                 system: list[Any] | None = None) -> list[Item]:
    """The distilled prefix as history items: a user message holding it and an
    assistant acknowledgement (the frozen pair; an Anthropic breakpoint on the
    user message's block), then, when the raw tail starts inside an agent turn,
    a user message repeating that turn's ``request``. Roles alternate on both
    sides either way, and the pair's bytes never depend on where the tail starts.

    ``system``: the client's system messages from the part the prefix replaces,
    kept as they were, right after the prefix's user message (Anthropic allows a
    mid-conversation system message only right after a user message)."""
    request_text = f"{REQUEST_HEAD}\n{request}" if request else ""
    kept = list(system or ())
    if family is Family.RESPONSES:
        out: list[Item] = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            *kept,
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": PREFIX_ACK}]}]
        if request_text:
            out.append({"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": request_text}]})
        return out
    if family is Family.CHAT:
        out = [{"role": "user", "content": text}, *kept,
               {"role": "assistant", "content": PREFIX_ACK}]
        if request_text:
            out.append({"role": "user", "content": request_text})
        return out
    user_block: Item = {"type": "text", "text": text}
    if breakpoint:
        marker: dict[str, Any] = {"type": "ephemeral"}
        if cache_ttl:
            marker["ttl"] = cache_ttl
        user_block["cache_control"] = marker
    out = [{"role": "user", "content": [user_block]}, *kept,
           {"role": "assistant", "content": [{"type": "text", "text": PREFIX_ACK}]}]
    if request_text:
        out.append({"role": "user", "content": [{"type": "text", "text": request_text}]})
    return out


def repair_boundary(family: Family, tail: list[Any]) -> list[Any]:
    """Drop tool outputs at the start of the tail whose call was cut off (and,
    for Anthropic, tool_result blocks of a leading user message), so no result
    is left without its call. Cut points make this a no-op; a client history
    that is itself odd is still sent valid."""
    start = 0
    while start < len(tail) and is_tool_output(family, tail[start]):
        if family is Family.ANTHROPIC:
            rest = [b for b in tail[start]["content"]
                    if not (isinstance(b, dict) and b.get("type") == "tool_result")]
            if rest:
                return [{**tail[start], "content": rest}, *tail[start + 1:]]
        start += 1
    return tail[start:] if start else tail


def count_breakpoints(payload: dict[str, Any], items: list[Any]) -> int:
    """Anthropic cache_control markers: tools, system blocks, message blocks."""
    count = 0
    for key in ("tools", "system"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            count += sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            count += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    if "cache_control" in payload:
        count += 1
    return count


def drop_oldest_breakpoints(items: list[Any], excess: int, start: int) -> list[Any]:
    """Remove the ``excess`` oldest message-level breakpoints from ``start`` on
    (the client's own markers in the raw tail; ours before ``start`` stay)."""
    out = list(items)
    for index in range(start, len(out)):
        if excess <= 0:
            break
        item = out[index]
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        blocks = []
        for block in content:
            if excess > 0 and isinstance(block, dict) and "cache_control" in block:
                block = {k: v for k, v in block.items() if k != "cache_control"}
                excess -= 1
            blocks.append(block)
        out[index] = {**item, "content": blocks}
    return out


def prefix_ttl(payload: dict[str, Any], tail: list[Any]) -> str | None:
    """The TTL our prefix breakpoint takes from the client's markers as they are
    in this request (Anthropic processes tools, system, then messages, and a
    ``1h`` marker must not come after a ``5m`` one).

    The client's first marker after ours (in the raw tail) when there is one: not
    shorter than anything after it, in the client's own valid order. Else the
    last marker before ours (tools, system), so ours is not longer than it. A
    client that switches its markers from 5m to 1h (Claude Code does, as quotas
    change) moves ours with them at the next render; ``cache_control`` is not
    part of the cached bytes, so following it costs no cache hit."""
    for item in tail:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    return _ttl(block["cache_control"])
    before: str | None = None
    for key in ("tools", "system"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            for block in blocks:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    before = _ttl(block["cache_control"])
    return before


def _ttl(marker: dict[str, Any]) -> str | None:
    ttl = marker.get("ttl")
    return str(ttl) if ttl else None
