"""Knowledge into the upstream request: a pure, cache-safe transform.

``inject_knowledge(payload, ctx)`` puts the session's frozen block at the end of
the system prompt (the protocol's adapter, ``HistoryAdapter.add_system_text``:
Anthropic ``system``, Responses ``instructions`` or a developer item after the
leading ones, a Chat system message after the leading ones) and re-inserts
every mid-session update at the position it was first given. The same inputs
always give the same bytes, and every position is in the client's own history,
which only grows: each request stays a byte-for-byte extension of the previous
one. No ``cache_control`` is ever added, so an Anthropic request never gains a
breakpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from lore_gateway.knowledge.block import UPDATE_ACK
from lore_gateway.protocols.history import HistoryAdapter, adapter_for
from lore_gateway.routing import Family


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
    history = adapter_for(ctx.family)
    key = history.items_key
    out = dict(payload)
    items = out.get(key)
    if isinstance(items, list) and view.deltas:
        spliced = list(items)
        for delta in sorted(view.deltas, key=lambda d: d.position, reverse=True):
            # Still the user message it was placed before? After a client-side
            # compaction the position means something else: leave it out.
            if 0 <= delta.position < len(items) \
                    and history.is_user_text(items[delta.position]):
                spliced[delta.position:delta.position] = history.update_items(delta.text,
                                                                              UPDATE_ACK)
        out[key] = spliced
    if view.block:
        out = history.add_system_text(out, view.block)
    return out


def update_slot(history: HistoryAdapter, items: Any) -> int | None:
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
        if history.is_user_text(item):
            return index
        if item.get("role") not in ("system", "developer"):
            return None
    return None
