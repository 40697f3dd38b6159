"""The pipeline's ``context`` slot: render the planned layout (pure).

The state comes from ``ContextService.prepare`` through ``ctx.context``, decided
before the pipeline runs; this renders it. It also tells the knowledge slot
where the session's knowledge updates are in the rewritten history (their
positions are client-history indices).
"""

from __future__ import annotations

from typing import Any, Protocol

from lore_gateway.context import planner
from lore_gateway.context.planner import SessionState
from lore_gateway.knowledge.inject import Delta, KnowledgeContext, KnowledgeView
from lore_gateway.protocols.history import adapter_for
from lore_gateway.routing import Family


class ContextRequest(Protocol):
    @property
    def family(self) -> Family: ...

    @property
    def context(self) -> SessionState | None: ...

    @property
    def knowledge(self) -> KnowledgeView | None: ...


def manage_context(payload: dict[str, Any], ctx: ContextRequest) -> dict[str, Any]:
    """The upstream history of a managed session; ``payload`` itself otherwise."""
    if ctx.context is None:
        return payload
    return planner.render(adapter_for(ctx.family), payload, ctx.context)


def knowledge_context(ctx: ContextRequest) -> Any:
    """``ctx`` for the knowledge slot, its update positions moved to where those
    client items are in the rewritten history (``ctx`` itself when not managed)."""
    state, view = ctx.context, ctx.knowledge
    if state is None or view is None or not view.deltas or state.layer == 0:
        return ctx
    deltas = tuple(Delta(planner.remap(state, d.position), d.text) for d in view.deltas)
    return KnowledgeContext(ctx.family, KnowledgeView(view.block, deltas))
