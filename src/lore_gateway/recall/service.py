"""Hidden recall, as the proxy sees it: one object with two questions.

``prepare`` decides, before forwarding, whether this request gets the recall
tool (and returns the upstream body with it); ``respond`` serves the upstream's
answer to the client through the protocol's recall handler, which hides recall
calls, runs them and continues the answer in the same response. Everything
protocol-specific lives in the handlers; this module only picks one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.channel import JSON_HEADERS, ClientChannel
from lore_gateway.errors import error_body
from lore_gateway.exchange import Exchange
from lore_gateway.headers import client_response_headers
from lore_gateway.memory.records import Identity
from lore_gateway.obs import metrics
from lore_gateway.protocols import responses
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.usage import usage_from_responses
from lore_gateway.recall import anthropic_handler, chat_handler, telemetry, tool
from lore_gateway.recall.anchor_store import AnchorStore
from lore_gateway.recall.anthropic_handler import RecallContext, StagedRecall
from lore_gateway.recall.budget import RecallChainBudget
from lore_gateway.recall.executor import RecallExecutor
from lore_gateway.recall.markers import parse_anchor
from lore_gateway.recall.replay import AnchorReplay
from lore_gateway.recall.responses_handler import (
    buffered_responses_recall,
    stream_responses_recall,
)
from lore_gateway.recall.responses_round import Limits
from lore_gateway.routing import Protocol, Route
from lore_gateway.turns import TurnCollector
from lore_gateway.upstream import UpstreamClient, UpstreamResponse

log = logging.getLogger("lore.recall")

_TOOL_PROTOCOL: dict[Protocol, tool.Protocol] = {
    Protocol.RESPONSES: "responses",
    Protocol.CODEX: "responses",
    Protocol.CHAT: "chat",
    Protocol.ANTHROPIC: "anthropic",
}


def is_codex_client(headers: dict[str, str]) -> bool:
    """The Codex CLI marks its requests with an ``originator`` header
    (``codex_exec``, ``codex_cli_rs``, ...)."""
    return headers.get("originator", "").startswith("codex")


@dataclass(frozen=True, slots=True)
class Prepared:
    """The upstream body (None: forward the client's bytes unchanged) and whether
    it carries the hidden recall tool (then the answer goes through ``respond``)."""

    upstream_payload: dict[str, Any] | None
    inject: bool


@dataclass(slots=True)
class RecallOutcome:
    """What the turn's storage needs from a recall-served response."""

    outputs: list[Message]
    complete: bool


class RecallService:
    """Hidden recall for one gateway."""

    def __init__(self, memory: Any, upstream: UpstreamClient,
                 anchors: AnchorStore | None = None) -> None:
        self.memory = memory
        self.upstream = upstream
        settings = getattr(memory, "settings", None)
        if anchors is None:
            anchors = AnchorStore(getattr(settings, "db_path", None))
        self.replay = AnchorReplay(anchors)
        self.limits = _live_limits(settings)
        self.knowledge: Any = None  # the knowledge slot (knowledge/service.py)

    async def prepare(self, route: Route, headers: dict[str, str], payload: dict[str, Any],
                      identity: Identity, body: bytes) -> Prepared:
        """What goes upstream: the client's history with our anchors expanded
        back into the exact recall pairs (always, so history stays byte-stable),
        then the recall tool injected when the request qualifies (B.8)."""
        assert route.protocol is not None
        family = _TOOL_PROTOCOL[route.protocol]
        expanded = await self.replay.expand(family, payload, identity, body)
        if self.knowledge is not None:
            current = payload if expanded is None else expanded
            knowing = await self.knowledge.prepare(family, current, identity, headers)
            expanded = None if knowing is payload else knowing
        injected = tool.inject(family, payload if expanded is None else expanded,
                               codex_client=is_codex_client(headers))
        return Prepared(injected if injected is not None else expanded, injected is not None)

    def close(self) -> None:
        """Finish the anchor store's queued writes."""
        self.replay.store.close()

    async def respond(self, exchange: Exchange, resp: UpstreamResponse,
                      client: ClientChannel, upstream_payload: dict[str, Any],
                      collector: TurnCollector) -> RecallOutcome:
        """Serve a 2xx upstream answer to a request that carries the recall tool."""
        ctx = RecallContext(
            upstream=self.upstream,
            url=exchange.upstream_url,
            headers=exchange.upstream_headers,
            body=upstream_payload,
            executor=RecallExecutor(self.memory, exchange.identity),
            budget=RecallChainBudget(),
            session=exchange.identity.session if exchange.identity is not None else "",
        )
        ctx.on_delivered = lambda staged: self._delivered(exchange, staged)
        protocol = exchange.protocol
        codex = protocol is Protocol.CODEX
        headers = client_response_headers(resp.raw_headers)
        if exchange.client_stream:
            if protocol in (Protocol.RESPONSES, Protocol.CODEX):
                await client.start(resp.status, headers)
                icpt = await stream_responses_recall(ctx, resp, _Tee(client, None), codex=codex,
                                                     limits=self.limits)
                await client.end()
                delivered = icpt.delivered_response()
                if delivered is not None:
                    _check_empty(exchange, delivered, icpt.depth)
                    _report_usage(exchange, delivered)
                return RecallOutcome(_item_messages(icpt.turn_items()), icpt.failure is None)
            handler = anthropic_handler if protocol is Protocol.ANTHROPIC else chat_handler
            tee = _Tee(client, collector)
            await handler.stream_recall(ctx, resp, tee, headers)
            collector.report_usage(protocol.value)
            return RecallOutcome(collector.outputs() + _staged_messages(ctx), True)
        try:
            principal = await _principal_json(exchange, resp, collector)
        except (ProtocolError, ValueError) as exc:
            log.warning("recall principal unusable: %s", exc)
            await client.respond(502, error_body("server_error", "Gateway request failed"))
            return RecallOutcome([], False)
        if protocol in (Protocol.RESPONSES, Protocol.CODEX):
            status, extra, body, final = await buffered_responses_recall(ctx, principal,
                                                                         codex=codex)
            await client.respond(status, body, JSON_HEADERS + extra)
            if final is None:
                return RecallOutcome([], False)
            ctx.delivered()
            _check_empty(exchange, final, ctx.budget.executions)
            _report_usage(exchange, final)
            calls = {s.anchor_id: s.assistant for s in ctx.staged if s.anchor_id}
            return RecallOutcome(_item_messages(final.get("output") or [], calls), True)
        handler = anthropic_handler if protocol is Protocol.ANTHROPIC else chat_handler
        status, body, extra = await handler.buffered_recall(ctx, principal)
        await client.respond(status, body, extra)
        if status != 200:
            return RecallOutcome([], False)
        ctx.delivered()
        answer = TurnCollector(protocol, max_json_bytes=len(body) + 1)
        answer.feed(body)
        answer.report_usage(protocol.value)
        return RecallOutcome(answer.outputs() + _staged_messages(ctx), True)

    def _delivered(self, exchange: Exchange, staged: list[StagedRecall]) -> None:
        """The client has the whole answer: keep its recalls for expansion."""
        family = _TOOL_PROTOCOL[exchange.protocol]
        self.replay.commit(family, exchange.payload, exchange.identity, staged)


def _report_usage(exchange: Exchange, response: dict[str, Any]) -> None:
    """Token metrics from a delivered Responses answer (the overview's token charts)."""
    try:
        usage = usage_from_responses(response.get("usage"))
    except Exception:
        return
    metrics.record_usage(exchange.protocol.value, usage.prompt_tokens, usage.cache_read or 0,
                         usage.output_tokens)


def _live_limits(settings: Any) -> Limits:
    """The live Responses limits from the settings (E.1 defaults without them)."""
    if settings is None:
        return Limits()
    return Limits(stream_bytes=settings.recall_stream_max_bytes,
                  retained_bytes=settings.recall_retained_max_bytes,
                  deferred_bytes=settings.recall_deferred_max_bytes)


class _Tee:
    """The client channel, with every byte written also fed to a collector."""

    def __init__(self, client: ClientChannel, collector: TurnCollector | None) -> None:
        self._client = client
        self._collector = collector

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await self._client.start(status, headers)

    async def write(self, data: bytes) -> None:
        await self._client.write(data)
        if self._collector is not None:
            self._collector.feed(data)

    async def end(self, data: bytes = b"") -> None:
        await self._client.end(data)
        if self._collector is not None and data:
            self._collector.feed(data)


async def _principal_json(exchange: Exchange, resp: UpstreamResponse,
                          collector: TurnCollector) -> dict[str, Any]:
    """The principal answer as one JSON object (a Codex stream is accumulated)."""
    if exchange.upstream_stream:
        async for chunk in resp.chunks():
            collector.feed(chunk)
        return collector.response_body()
    body, cut = await resp.read(anthropic_handler.MAX_JSON_BYTES)
    if cut:
        raise ProtocolError("foreground response exceeded 4194304 byte limit")
    payload = orjson.loads(body)
    if not isinstance(payload, dict):
        raise ProtocolError("upstream response is not a JSON object")
    return payload


def _item_messages(items: list[dict[str, Any]],
                   calls: dict[str, dict[str, Any]] | None = None) -> list[Message]:
    """A Responses turn for storage: the model's items, recall calls included.

    An anchor item (what the client got in place of a recall) is stored as the
    recall call it stands for, from ``calls`` (anchor id → ``function_call``), never
    as its text. Recall *results* are left out: they are copies of stored memory,
    and storing them again would make every later search find its own echo.
    """
    kept: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "function_call_output":
            continue
        anchor = _anchor_of(item)
        if anchor is None:
            kept.append(item)
        elif calls and anchor in calls:
            kept.append(calls[anchor])
    return responses.items_messages(kept)


def _anchor_of(item: dict[str, Any]) -> str | None:
    """The anchor id of a message item that only carries a recall anchor."""
    content = item.get("content") if item.get("type") == "message" else None
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        return parse_anchor(str(content[0].get("text") or ""))
    return None


def _check_empty(exchange: Exchange, response: dict[str, Any], depth: int) -> None:
    """Empty-completion telemetry for a delivered Responses answer (never raises)."""
    session = exchange.identity.session if exchange.identity is not None else ""
    telemetry.check_responses(response, protocol=exchange.protocol.value, session=session,
                              recall_depth=depth)


def _staged_messages(ctx: RecallContext) -> list[Message]:
    """The recall calls of a turn, as storage text (results left out, as above)."""
    return [Message("assistant", f"[tool_call:recall] {s.call.arguments}") for s in ctx.staged]
