"""Conversation history as the context planner needs it (pure).

The planner works on the list of history items (Anthropic and Chat
``messages``, Responses ``input``) by index. This module answers, through the
protocol's history adapter (``protocols/history.py``): where a raw tail may
start without orphaning a tool call or result, how a tool output is stripped,
what the distilled prefix looks like, and the repairs at the boundary. The
adapter knows each protocol's shapes; the rules here are written once.
Everything here returns new objects and never mutates its input.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.protocols.history import HistoryAdapter
from lore_gateway.protocols.history_common import Item

# Tool outputs shorter than this stay whole even on stripping layers: a stub
# would save little and lose the whole output.
STRIP_MIN_CHARS = 600
# What a stripped output keeps of its head (a file path, an error line).
STRIP_KEEP_CHARS = 240
# The emergency layer truncates single tool outputs longer than this (head and
# tail kept), so one huge output cannot overflow the window by itself.
EMERGENCY_OUTPUT_CHARS = 24_000
PREFIX_ACK = "Understood. I have the earlier session history above and can recall details."
REQUEST_HEAD = "[lore-gateway] The user's current request (its work continues below):"
THINKING_BLOCKS = ("thinking", "redacted_thinking")


def cut_points(history: HistoryAdapter, items: list[Any], lead: int, *,
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
        new_round = (history.is_tool_output(before) and isinstance(item, dict)
                     and not history.is_tool_output(item) and history.is_assistant_side(item))
        if new_round and thinking in ("enabled", "adaptive") and not starts_with_thinking(item):
            new_round = thinking == "adaptive" and not thinks_after[index]
        if new_round or history.is_user_text(item):
            out.append(index)
    return out


def _thinking_suffix(items: list[Any]) -> list[bool]:
    """For each index, whether any item from there on holds a thinking block."""
    out = [False] * (len(items) + 1)
    for index in range(len(items) - 1, -1, -1):
        content = items[index].get("content") if isinstance(items[index], dict) else None
        out[index] = out[index + 1] or (isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in THINKING_BLOCKS for b in content))
    return out


def starts_with_thinking(item: Any) -> bool:
    content = item.get("content") if isinstance(item, dict) else None
    return (isinstance(content, list) and bool(content) and isinstance(content[0], dict)
            and content[0].get("type") in THINKING_BLOCKS)


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


def strip_output(history: HistoryAdapter, item: Any, truncate_to: int | None = None) -> Any:
    """A tool-output item with its output replaced by a short stub (stripping
    layers) or cut to ``truncate_to`` characters (emergency); the item itself
    when it holds no output worth shrinking. Deterministic: the same item always
    gives the same bytes, so a stripped tail stays cache-stable."""
    if not history.is_tool_output(item):
        return item
    return history.shrink_output(item, lambda text: _shrink(text, truncate_to))


def prefix_items(history: HistoryAdapter, text: str, *, request: str = "",
                 cache_control: Item | None = None,
                 system: list[Any] | None = None) -> list[Item]:
    """The distilled prefix as history items: a user message holding it and an
    assistant acknowledgement (the frozen pair; ``cache_control``, a breakpoint
    on the user message where the protocol has them), then, when the raw tail
    starts inside an agent turn, a user message repeating that turn's
    ``request``. Roles alternate on both sides either way, and the pair's bytes
    never depend on where the tail starts.

    ``system``: the client's system messages from the part the prefix replaces,
    kept as they were, right after the prefix's user message (Anthropic allows a
    mid-conversation system message only right after a user message)."""
    out = [history.user_message(text, cache_control), *(system or ()),
           history.assistant_message(PREFIX_ACK)]
    if request:
        out.append(history.user_message(f"{REQUEST_HEAD}\n{request}"))
    return out


def repair_boundary(history: HistoryAdapter, tail: list[Any]) -> list[Any]:
    """Drop tool outputs at the start of the tail whose call was cut off (and,
    for Anthropic, tool_result blocks of a leading user message), so no result
    is left without its call. Cut points make this a no-op; a client history
    that is itself odd is still sent valid."""
    start = 0
    while start < len(tail) and history.is_tool_output(tail[start]):
        rest = history.without_tool_results(tail[start])
        if rest is not None:
            return [rest, *tail[start + 1:]]
        start += 1
    return tail[start:] if start else tail
