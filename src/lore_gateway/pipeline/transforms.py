"""The request pipeline: what the gateway does to a model request before it goes
upstream, as an explicit, ordered list of named pure transforms.

Each transform is ``(payload, ctx) -> payload``: it returns the upstream payload,
the same object when it changes nothing (then the client's bytes are forwarded
untouched), never mutating its input. ``ctx`` is a frozen :class:`RequestContext`
with everything a transform may look at, gathered once before the pipeline runs
(the only async step: loading the session's recall anchors), so every transform
is a unit test with a dict in and a dict out.

The order is part of the contract:

0. ``expand_compaction``: a Codex ``compaction`` item the gateway answered with
   (compaction/answers.py) back into the summary it stands for;
1. ``expand_anchors`` first, so every later step sees the history the upstream saw
   last time (byte-stable: the provider's prompt cache keeps hitting);
2. ``context`` (issue 13): a managed session's distilled prefix and raw tail
   (``context.transform.manage_context``; the layout is planned before the
   pipeline, by ``context.service.ContextService.prepare``, as ``ctx.context``);
3. ``knowledge`` (issue 12): the session's frozen knowledge block and appended
   updates (``knowledge.inject.inject_knowledge``; its one async step, deciding
   what the session carries, runs before the pipeline and arrives as
   ``ctx.knowledge``);
4. ``inject_tool`` last, so the recall tool is added to the final tool list.

Plugging a transform into a slot is one line in :data:`REQUEST_PIPELINE`; no
handler changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from lore_gateway.compaction.answers import expand_handles
from lore_gateway.context.planner import SessionState
from lore_gateway.context.transform import knowledge_context, manage_context
from lore_gateway.knowledge.inject import KnowledgeView, inject_knowledge
from lore_gateway.memory.anchor_store import SessionRecalls
from lore_gateway.memory.records import Identity
from lore_gateway.recall import replay
from lore_gateway.recall.core import tool
from lore_gateway.routing import Family, Protocol, family_of

log = logging.getLogger("lore.recall")

Payload = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a request transform may know about the request, read-only."""

    protocol: Protocol
    identity: Identity
    headers: Mapping[str, str]  # the client's request headers, lower-case names
    codex_client: bool
    # The session's stored recalls when the body may carry an anchor, else None.
    anchors: SessionRecalls | None = None
    # What the session's knowledge slot adds (None: nothing; knowledge/service.py).
    knowledge: KnowledgeView | None = None
    # The session's planned context layout (None: history passes through).
    context: SessionState | None = None
    # Length of the client's decoded body in bytes (0 when unknown): a size
    # estimate for the ``context`` slot without re-serialising the payload.
    body_bytes: int = 0

    @property
    def family(self) -> Family:
        return family_of(self.protocol)

    @property
    def tenant(self) -> str:
        return self.identity.tenant

    @property
    def project(self) -> str:
        return self.identity.project

    @property
    def session(self) -> str:
        return self.identity.session


Transform = Callable[[Payload, RequestContext], Payload]


def is_codex_client(headers: Mapping[str, str]) -> bool:
    """The Codex CLI marks its requests with an ``originator`` header
    (``codex_exec``, ``codex_cli_rs``, ...)."""
    return headers.get("originator", "").startswith("codex")


def request_context(protocol: Protocol, headers: Mapping[str, str], identity: Identity,
                    anchors: SessionRecalls | None = None, *, body_bytes: int = 0,
                    knowledge: KnowledgeView | None = None,
                    context: SessionState | None = None) -> RequestContext:
    view = headers if isinstance(headers, MappingProxyType) else MappingProxyType(dict(headers))
    return RequestContext(protocol=protocol, identity=identity, headers=view,
                          codex_client=is_codex_client(headers), anchors=anchors,
                          knowledge=knowledge, context=context, body_bytes=body_bytes)


# --- the transforms -------------------------------------------------------------


def expand_compaction(payload: Payload, ctx: RequestContext) -> Payload:
    """Our own Codex ``compaction`` items (opaque handles) back into the summary
    message they carry; OpenAI's own items are left alone."""
    if ctx.family is not Family.RESPONSES:
        return payload
    items = payload.get("input")
    if not isinstance(items, list):
        return payload
    expanded = expand_handles(items)
    return payload if expanded is None else {**payload, "input": expanded}


def expand_anchors(payload: Payload, ctx: RequestContext) -> Payload:
    """Our anchors in the client's history back into the exact recall pairs the
    upstream saw (always, recall injected this turn or not)."""
    if ctx.anchors is None:
        return payload
    return replay.expand(ctx.family, payload, ctx.anchors)


def add_knowledge(payload: Payload, ctx: RequestContext) -> Payload:
    """The session's frozen knowledge block and its appended updates."""
    return inject_knowledge(payload, knowledge_context(ctx))


def inject_tool(payload: Payload, ctx: RequestContext) -> Payload:
    """The hidden recall tool, when the request qualifies (B.8)."""
    refusal = tool.injection_refusal(ctx.family, payload, codex_client=ctx.codex_client)
    if refusal is not None:
        log.debug("recall not injected (session %s): %s", ctx.session[:16], refusal)
        return payload
    return tool.with_recall_tool(ctx.family, payload)


# The pipeline. A slot holding None is a named place for a later transform.
REQUEST_PIPELINE: tuple[tuple[str, Transform | None], ...] = (
    ("expand_compaction", expand_compaction),  # issue 13: our compaction items
    ("expand_anchors", expand_anchors),
    ("context", manage_context),  # issue 13: context management
    ("knowledge", add_knowledge),  # issue 12: knowledge block and updates
    ("inject_tool", inject_tool),
)


def run(payload: Payload, ctx: RequestContext,
        pipeline: tuple[tuple[str, Transform | None], ...] = REQUEST_PIPELINE) -> Payload:
    """Apply the transforms in order; the client's payload object itself when
    none changed anything."""
    for _name, transform in pipeline:
        if transform is not None:
            payload = transform(payload, ctx)
    return payload


def carries_recall(family: Family, before: Payload, after: Payload) -> bool:
    """Whether the pipeline gave this request the hidden recall tool (the client's
    own ``recall`` is never ours)."""
    return (after is not before and tool.has_recall_tool(family, after)
            and not tool.has_recall_tool(family, before))
