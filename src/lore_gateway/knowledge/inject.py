"""Knowledge into the upstream request: a pure, cache-safe transform.

``inject_knowledge(payload, ctx)`` puts the session's frozen block at the end of
the system prompt (Anthropic ``system``, Responses ``instructions`` or a
developer item after the leading ones, a Chat system message after the leading
ones) and re-inserts every mid-session update at the position it was first
given. The same inputs always give the same bytes, and every position is in the
client's own history, which only grows: each request stays a byte-for-byte
extension of the previous one. No ``cache_control`` is ever added, so an
Anthropic request never gains a breakpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from lore_gateway.knowledge.block import UPDATE_ACK

Family = Literal["anthropic", "responses", "chat"]


@dataclass(frozen=True, slots=True)
class Delta:
    """A mid-session update: its text, inserted before client item ``position``."""

    position: int
    text: str


@dataclass(frozen=True, slots=True)
class KnowledgeView:
    """What one request of a session carries: the frozen block and the updates."""

    block: str
    deltas: tuple[Delta, ...] = ()


class KnowledgeRequest(Protocol):
    """What ``inject_knowledge`` reads from the request context."""

    @property
    def family(self) -> Family: ...

    @property
    def knowledge(self) -> KnowledgeView | None: ...


@dataclass(frozen=True, slots=True)
class KnowledgeContext:
    family: Family
    knowledge: KnowledgeView | None


def inject_knowledge(payload: dict[str, Any], ctx: KnowledgeRequest) -> dict[str, Any]:
    """``payload`` with the knowledge block and updates; ``payload`` itself when
    there is nothing to add (the caller then forwards the client's bytes)."""
    view = ctx.knowledge
    if view is None or (not view.block and not view.deltas):
        return payload
    key = "input" if ctx.family == "responses" else "messages"
    out = dict(payload)
    items = out.get(key)
    if isinstance(items, list) and view.deltas:
        spliced = list(items)
        for delta in sorted(view.deltas, key=lambda d: d.position, reverse=True):
            # Still the user message it was placed before? After a client-side
            # compaction the position means something else: leave it out.
            if 0 <= delta.position < len(items) and isinstance(items[delta.position], dict) \
                    and _is_user_text(ctx.family, items[delta.position]):
                spliced[delta.position:delta.position] = _update_items(ctx.family, delta.text)
        out[key] = spliced
    if view.block:
        _add_block(ctx.family, out, view.block)
    return out


def _update_items(family: Family, text: str) -> list[dict[str, Any]]:
    if family == "anthropic":
        # A user/assistant pair: role alternation holds on both sides, and the
        # model has nothing to answer.
        return [{"role": "user", "content": [{"type": "text", "text": text}]},
                {"role": "assistant", "content": [{"type": "text", "text": UPDATE_ACK}]}]
    if family == "responses":
        return [{"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": text}]}]
    return [{"role": "system", "content": text}]


def _add_block(family: Family, out: dict[str, Any], block: str) -> None:
    if family == "anthropic":
        system = out.get("system")
        if isinstance(system, list):
            out["system"] = [*system, {"type": "text", "text": block}]
        elif isinstance(system, str) and system:
            out["system"] = system + "\n\n" + block
        else:
            out["system"] = block
        return
    if family == "responses":
        instructions = out.get("instructions")
        if isinstance(instructions, str) and instructions:
            out["instructions"] = instructions + "\n\n" + block
            return
        item = {"type": "message", "role": "developer",
                "content": [{"type": "input_text", "text": block}]}
        items = out.get("input")
        if isinstance(items, str):
            out["input"] = [item, {"type": "message", "role": "user",
                                   "content": [{"type": "input_text", "text": items}]}]
        elif isinstance(items, list):
            at = _leading_system(items)
            out["input"] = [*items[:at], item, *items[at:]]
        return
    items = out.get("messages")
    if isinstance(items, list):
        at = _leading_system(items)
        out["messages"] = [*items[:at], {"role": "system", "content": block}, *items[at:]]


def _leading_system(items: list[Any]) -> int:
    """How many items at the start are system/developer instructions."""
    count = 0
    for item in items:
        if not isinstance(item, dict) or item.get("role") not in ("system", "developer"):
            break
        count += 1
    return count


def update_slot(family: Family, items: Any) -> int | None:
    """Where a new update may go in this request's client history, or None.

    Before the newest user message, when nothing but instructions follows it: the
    message is new in this request (so everything sent before stays a prefix),
    and the update never lands between a tool call and its result.
    """
    if not isinstance(items, list):
        return None
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if not isinstance(item, dict):
            return None
        if _is_user_text(family, item):
            return index
        if item.get("role") not in ("system", "developer"):
            return None
    return None


def _is_user_text(family: Family, item: dict[str, Any]) -> bool:
    if item.get("role") != "user":
        return False
    if family == "responses":
        return bool(item.get("type", "message") == "message")
    content = item.get("content")
    if family == "anthropic" and isinstance(content, list):
        return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    return True
