"""The request pipeline's asyncio shell: what the proxy asks before it forwards a
model request, and what context management learns from the answer.

``prepare`` runs the IO halves first, in this order, each on the history as the
upstream will see it: the session's recall anchors are loaded (only when the
body may hold one) and expanded; ``KnowledgeService.view`` decides what
knowledge the session carries; ``ContextService.prepare`` plans its layout.
Then the pure slots run (``transforms.REQUEST_PIPELINE``) and the upstream's own
rules apply. Each feature is a constructor argument, None when it is off, so
switching one off never switches off another (``LORE_RECALL=false`` keeps
knowledge and context management).

After the request went out, context management may need the answer:
``retry_overflow`` turns a context-length error into a higher layer and a
rebuilt request, ``observe`` calibrates the session's estimate with the usage
the upstream reported, and ``fit`` sizes a recall chain's follow-ups.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from lore_gateway.context import overflow as context_overflow
from lore_gateway.context.service import ContextService
from lore_gateway.exchange import Exchange, requested_model
from lore_gateway.knowledge.service import KnowledgeService
from lore_gateway.memory.store.records import Identity
from lore_gateway.pipeline import transforms
from lore_gateway.recall import replay
from lore_gateway.recall.fit import ContextFit
from lore_gateway.recall.replay import AnchorReplay
from lore_gateway.routing import Protocol, Route, family_of
from lore_gateway.turns import TurnOutcome

log = logging.getLogger("lore.pipeline")


class Prepared(msgspec.Struct, frozen=True):
    """What goes upstream: the body (None: the client's bytes unchanged), whether
    the upstream is asked to stream, and whether the body carries the hidden
    recall tool (then the answer goes through ``RecallService.respond``)."""

    upstream_payload: dict[str, Any] | None
    upstream_stream: bool
    inject: bool


class RequestPipeline:
    """One gateway's request pipeline: the features that shape a request.

    ``anchors``: recall's anchor replay (None with recall off: no anchor is
    expanded and the ``inject_tool`` slot is empty); ``knowledge`` and
    ``context``: the IO halves of their slots (None without memory).
    """

    def __init__(self, *, anchors: AnchorReplay | None = None,
                 knowledge: KnowledgeService | None = None,
                 context: ContextService | None = None) -> None:
        self.anchors = anchors
        self.knowledge = knowledge
        self.context = context
        self.slots = transforms.slots(recall=anchors is not None)

    async def prepare(self, route: Route, headers: Mapping[str, str], payload: dict[str, Any],
                      identity: Identity | None, body: bytes, *, coding: bool,
                      keep: bool = True) -> Prepared:
        """The client's payload through the pipeline (a request without an
        identity, memory off, only through the upstream's rules).
        ``coding``: a coding agent's turn (knowledge and context serve only those).
        ``keep``: False for a turn memory does not keep (``Exchange.keep``): knowledge
        and context shape the request as usual but write nothing."""
        changed = None
        if identity is not None:
            shaped = await self._shape(route, headers, payload, identity, body,
                                       coding=coding, keep=keep)
            changed = None if shaped is payload else shaped
        upstream, stream = transforms.upstream_rules(route, payload, changed)
        inject = changed is not None and transforms.carries_recall(
            family_of(_protocol(route)), payload, changed)
        return Prepared(upstream, stream, inject)

    async def _shape(self, route: Route, headers: Mapping[str, str], payload: dict[str, Any],
                     identity: Identity, body: bytes, *, coding: bool,
                     keep: bool) -> dict[str, Any]:
        protocol = _protocol(route)
        family = family_of(protocol)
        expanded = payload
        if self.anchors is not None:
            anchors = await self.anchors.session_for(identity, body)
            if anchors is not None:
                expanded = transforms.expand_anchors(payload, transforms.request_context(
                    protocol, headers, identity, anchors))
        view = layout = None
        if self.knowledge is not None:
            view = await self.knowledge.view(family, expanded, identity, coding=coding,
                                             keep=keep)
        if self.context is not None:
            # Sized as it goes upstream: the recall pairs expansion restored count.
            size = replay.expanded_length(family, payload, expanded, len(body))
            layout = await self.context.prepare(family, expanded, size, identity,
                                                requested_model(route, payload),
                                                coding=coding, keep=keep)
        ctx = transforms.request_context(protocol, headers, identity, body_bytes=len(body),
                                         knowledge=view, context=layout,
                                         array_stream=transforms.array_stream(route))
        return transforms.run(expanded, ctx, self.slots)

    # -- context management after the request went out ---------------------------------

    def manages(self, exchange: Exchange) -> bool:
        """Whether context management shapes this request (``LORE_CONTEXT=false``:
        an overflow then reaches the client as it came)."""
        return (self.context is not None and self.context.settings.context
                and exchange.identity is not None)

    async def retry_overflow(self, exchange: Exchange, status: int, body: bytes) -> bool:
        """An upstream error read whole: when it is a context-length error, the
        session is forced to a higher context layer and the exchange's upstream
        request rebuilt (True: send it once more); any other error, False."""
        overflow = context_overflow.detect(status, body) if self.manages(exchange) else None
        if overflow is None:
            return False
        assert self.context is not None and exchange.identity is not None
        log.warning("upstream context overflow (ratio %s); retrying at a higher layer",
                    overflow.ratio)
        self.context.overflow(exchange.identity, overflow.ratio, overflow.limit,
                              len(exchange.upstream_body), keep=exchange.keep)
        prepared = await self.prepare(exchange.route, exchange.header_map, exchange.payload,
                                      exchange.identity, exchange.body, coding=exchange.coding,
                                      keep=exchange.keep)
        payload = prepared.upstream_payload
        exchange.upstream_payload = payload
        exchange.upstream_body = exchange.body if payload is None else orjson.dumps(payload)
        exchange.recall = prepared.inject
        return True

    def observe(self, exchange: Exchange, outcome: TurnOutcome) -> None:
        """Calibrate the session's context estimate with the real usage."""
        usage = outcome.calibration
        if usage is not None and self.manages(exchange):
            assert self.context is not None and exchange.identity is not None
            self.context.observe(exchange.identity, len(exchange.upstream_body),
                                 usage.prompt_tokens, usage.cache_read or 0, keep=exchange.keep)

    def fit(self, exchange: Exchange, upstream: dict[str, Any]) -> ContextFit | None:
        """Context management's fit of this request's recall follow-ups
        (recall/fit.py); None when the session's context is not managed."""
        identity = exchange.identity
        if self.context is None or identity is None or not exchange.coding:
            return None
        key = replay.history_key(family_of(exchange.protocol))
        items = upstream.get(key)

        async def rebase() -> list[Any] | None:
            assert identity is not None
            # The slots alone: the upstream's rules never touch the history.
            new = await self._shape(exchange.route, exchange.header_map, exchange.payload,
                                    identity, exchange.body, coding=exchange.coding,
                                    keep=exchange.keep)
            base = new.get(key) if new is not exchange.payload else None
            return base if isinstance(base, list) else None

        return ContextFit(self.context, identity, exchange.model or "",
                          key, len(items) if isinstance(items, list) else 0, rebase,
                          keep=exchange.keep)


def _protocol(route: Route) -> Protocol:
    assert route.protocol is not None, "only model routes have a request pipeline"
    return route.protocol
