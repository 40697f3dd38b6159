"""The request pipeline's pure half: what the gateway does to a model request
before it goes upstream, as an explicit, ordered list of named pure transforms.

Each transform is ``(payload, ctx) -> payload``: it returns the upstream payload,
the same object when it changes nothing (then the client's bytes are forwarded
untouched), never mutating its input. ``ctx`` is a frozen :class:`RequestContext`
with everything a transform may look at, gathered once before the slots run by
the pipeline's asyncio shell (``pipeline/request.py``), so every transform is a
unit test with a dict in and a dict out.

The order is part of the contract. Before the slots, the shell expands the
session's recall anchors (:func:`expand_anchors`, after loading the session's
anchors), so that the async halves below and every slot see the history the
upstream saw last time (byte-stable: the provider's prompt cache keeps
hitting); then it asks knowledge (``KnowledgeService.view``) and context
(``ContextService.prepare``) what this request carries. The slots:

1. ``expand_compaction``: a Codex ``compaction`` item the gateway answered with
   (compaction/answers.py) back into the summary it stands for;
2. ``context`` (issue 13): a managed session's distilled prefix and raw tail
   (``context.transform.manage_context``; the layout arrives as ``ctx.context``);
3. ``knowledge`` (issue 12): the session's frozen knowledge block and appended
   updates (``knowledge.inject.inject_knowledge``, as ``ctx.knowledge``), after
   context, whose rewritten history moves where those updates go;
4. ``inject_tool`` last, so the recall tool is added to the final tool list.

A feature that is off leaves its slot inert (its context field None, or, for
recall, the slot None: :func:`slots`), never another feature's. Plugging a
transform into a slot is one line in :data:`REQUEST_PIPELINE`; no handler
changes. :func:`upstream_rules` then applies the upstream's own rules (the
Codex backend's) to whatever the slots returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from lore_gateway.compaction.answers import expand_handles
from lore_gateway.context.planner import SessionState
from lore_gateway.context.transform import knowledge_context, manage_context
from lore_gateway.knowledge.inject import KnowledgeView, inject_knowledge
from lore_gateway.memory.store.anchor_store import SessionRecalls
from lore_gateway.memory.store.records import Identity
from lore_gateway.recall import replay
from lore_gateway.recall.core import tool
from lore_gateway.routing import Family, Protocol, Route, family_of

log = logging.getLogger("lore.recall")  # the recall slot says why it added no tool

Payload = dict[str, Any]


class RequestContext(msgspec.Struct, frozen=True):
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
    # A Gemini stream asked for as a JSON array (no ``alt=sse``), which the live
    # recall path does not read (:func:`array_stream`).
    array_stream: bool = False

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
                    context: SessionState | None = None,
                    array_stream: bool = False) -> RequestContext:
    view = headers if isinstance(headers, MappingProxyType) else MappingProxyType(dict(headers))
    return RequestContext(protocol=protocol, identity=identity, headers=view,
                          codex_client=is_codex_client(headers), anchors=anchors,
                          knowledge=knowledge, context=context, body_bytes=body_bytes,
                          array_stream=array_stream)


def array_stream(route: Route) -> bool:
    """A Gemini ``:streamGenerateContent`` without ``alt=sse``: its answer is one
    JSON array streamed element by element, not SSE."""
    query = route.upstream_path.partition("?")[2]
    return route.stream is True and "alt=sse" not in query.split("&")


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
    upstream saw (always, recall injected this turn or not). Not a slot: it runs
    before the async halves, which read the expanded history."""
    if ctx.anchors is None:
        return payload
    return replay.expand(ctx.family, payload, ctx.anchors)


def add_knowledge(payload: Payload, ctx: RequestContext) -> Payload:
    """The session's frozen knowledge block and its appended updates."""
    return inject_knowledge(payload, knowledge_context(ctx))


def inject_tool(payload: Payload, ctx: RequestContext) -> Payload:
    """The hidden recall tool, when the request qualifies (B.8)."""
    if ctx.array_stream:
        log.debug("recall not injected (session %s): a Gemini array stream", ctx.session[:16])
        return payload
    refusal = tool.injection_refusal(ctx.family, payload, codex_client=ctx.codex_client)
    if refusal is not None:
        log.debug("recall not injected (session %s): %s", ctx.session[:16], refusal)
        return payload
    return tool.with_recall_tool(ctx.family, payload)


Slots = tuple[tuple[str, Transform | None], ...]

# The pipeline. A slot holding None is a named place for a later transform.
REQUEST_PIPELINE: Slots = (
    ("expand_compaction", expand_compaction),  # issue 13: our compaction items
    ("context", manage_context),  # issue 13: context management
    ("knowledge", add_knowledge),  # issue 12: knowledge block and updates
    ("inject_tool", inject_tool),  # the hidden recall tool
)


def slots(*, recall: bool) -> Slots:
    """The pipeline of a gateway: the recall slot empty with ``LORE_RECALL=false``
    (context and knowledge switch themselves off through their own settings)."""
    if recall:
        return REQUEST_PIPELINE
    return tuple((name, None if name == "inject_tool" else step)
                 for name, step in REQUEST_PIPELINE)


def run(payload: Payload, ctx: RequestContext, pipeline: Slots = REQUEST_PIPELINE) -> Payload:
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


def upstream_rules(route: Route, payload: Payload,
                   changed: Payload | None) -> tuple[Payload | None, bool]:
    """Apply the upstream's own rules to the (possibly already changed) request.

    The Codex backend only streams, rejects ``max_output_tokens`` and requires
    ``store: false``. Returns the upstream payload (None when nothing changed, so
    the original bytes are forwarded) and the upstream stream flag.
    """
    current = payload if changed is None else changed
    if route.protocol is not Protocol.CODEX:
        return changed, route.streams(current)
    if (current.get("stream") is True and "max_output_tokens" not in current
            and current.get("store", False) is False):
        return changed, True
    upstream = dict(current)
    upstream["stream"] = True
    upstream.pop("max_output_tokens", None)
    upstream["store"] = False
    return upstream, True
