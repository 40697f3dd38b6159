"""Hidden recall, as the proxy sees it: the answer to a request that carries the
recall tool.

Whether a request gets the tool is the request pipeline's ``inject_tool`` slot
(pipeline/transforms.py). ``respond`` serves the upstream's answer to the client
through the protocol's recall handler, which hides recall calls, runs them and
continues the answer in the same response; every path comes to one
``TurnOutcome`` (turns.py). Everything protocol-specific lives in the handlers;
this module only picks one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from lore_gateway.channel import JSON_HEADERS, ClientChannel
from lore_gateway.collector import TurnCollector, stream_usage
from lore_gateway.config import Settings
from lore_gateway.errors import error_body
from lore_gateway.exchange import Exchange
from lore_gateway.headers import client_response_headers
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.recall_order import place_recalls
from lore_gateway.memory.store.records import RAW_OUTPUT_MAX_BYTES, RawOutputs, RecallRow
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.usage import Usage, usage_from_responses
from lore_gateway.recall.anthropic import handler as anthropic_handler
from lore_gateway.recall.chat import handler as chat_handler
from lore_gateway.recall.core import telemetry
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import (
    RecallContext,
    StagedRecall,
    read_json_principal,
)
from lore_gateway.recall.core.executor import RecallExecutor, SearchGate
from lore_gateway.recall.core.followup import body_stream_flag
from lore_gateway.recall.fit import ContextFit
from lore_gateway.recall.gemini import handler as gemini_handler
from lore_gateway.recall.replay import AnchorReplay
from lore_gateway.recall.responses.buffered import buffered_responses_recall
from lore_gateway.recall.responses.handler import stream_responses_recall
from lore_gateway.recall.responses.round import Limits
from lore_gateway.recall.responses.stored import turn_messages
from lore_gateway.routing import Family, Protocol, family_of
from lore_gateway.turns import TurnOutcome
from lore_gateway.upstream import UpstreamClient, UpstreamResponse

log = logging.getLogger("lore.recall")

# Context management's fit of a request's recall follow-ups (None: its context is
# not managed): ``RequestPipeline.fit``.
FitFor = Callable[[Exchange, dict[str, Any]], ContextFit | None]

# The protocols whose answer is one message the handler relays, hides and
# continues (Anthropic, Chat, Gemini); Responses has a path of its own.
_MESSAGE_HANDLERS = {
    Protocol.ANTHROPIC: anthropic_handler,
    Protocol.CHAT: chat_handler,
    Protocol.GEMINI: gemini_handler,
}


class RecallService:
    """Hidden recall for one gateway."""

    def __init__(self, memory: Memory, upstream: UpstreamClient, replay: AnchorReplay, *,
                 fit: FitFor) -> None:
        self.memory = memory
        self.upstream = upstream
        # The session's anchors: expanded by the request pipeline, committed here.
        self.replay = replay
        self.fit = fit
        self.limits = _live_limits(memory.settings)
        # Shared by every request: bounds the recall searches of the whole gateway.
        self.gate = SearchGate(timeout=memory.settings.search_timeout)

    async def respond(self, exchange: Exchange, resp: UpstreamResponse,
                      client: ClientChannel, upstream_payload: dict[str, Any],
                      collector: TurnCollector) -> TurnOutcome:
        """Serve a 2xx upstream answer to a request that carries the recall tool:
        dispatch to the protocol's path; every path comes to one ``TurnOutcome``."""
        assert exchange.identity is not None, "recall is only injected with an identity"
        ctx = RecallContext(
            upstream=self.upstream,
            url=exchange.upstream_url,
            headers=exchange.upstream_headers,
            body=upstream_payload,
            executor=RecallExecutor(self.memory, exchange.identity, self.gate),
            budget=RecallChainBudget(),
            session=exchange.identity.session,
            retained_bytes=self.limits.retained_bytes,
            fit=self.fit(exchange, upstream_payload),
            # Gemini says whether a follow-up streams in its URL's method.
            stream_flag=(gemini_handler.stream_flag if exchange.protocol is Protocol.GEMINI
                         else body_stream_flag),
        )
        ctx.on_delivered = lambda staged: self._delivered(exchange, staged)
        family = family_of(exchange.protocol)
        if exchange.client_stream:
            if family is Family.RESPONSES:
                return await self._stream_responses(exchange, ctx, resp, client)
            return await self._stream_messages(exchange, ctx, resp, client)
        try:
            principal = await _principal_json(exchange, resp, collector)
        except (ProtocolError, ValueError) as exc:
            log.warning("recall principal unusable: %s", exc)
            await client.respond(502, error_body("server_error", "Gateway request failed"))
            return TurnOutcome(False)
        if family is Family.RESPONSES:
            return await self._buffered_responses(exchange, ctx, principal, client)
        return await self._buffered_messages(exchange, ctx, principal, client)

    async def _stream_responses(self, exchange: Exchange, ctx: RecallContext,
                                resp: UpstreamResponse, client: ClientChannel) -> TurnOutcome:
        await client.start(resp.status, client_response_headers(resp.raw_headers))
        streamed = await stream_responses_recall(ctx, resp, client,
                                                 codex=exchange.protocol is Protocol.CODEX,
                                                 limits=self.limits)
        await client.end()
        icpt = streamed.interceptor
        delivered = icpt.delivered_response()
        usage = None
        if delivered is not None:
            _check_empty(exchange, delivered, icpt.depth)
            # The rounds' usage as read from their terminals (the delivered
            # response carries the same, re-encoded).
            usage = icpt.usage
        if streamed.untouched is not None:
            # Nothing was hidden and the items were never tracked: storage reads
            # them from the terminal's output (``answer_scan.responses_output``).
            raw = RawOutputs(exchange.protocol.value, streamed.untouched, ())
            return TurnOutcome(icpt.failure is None, raw=raw, usage=usage)
        return TurnOutcome(icpt.failure is None, turn_messages(icpt.turn_items()),
                           usage=usage, follow_ups=icpt.depth > 0)

    async def _stream_messages(self, exchange: Exchange, ctx: RecallContext,
                               resp: UpstreamResponse, client: ClientChannel) -> TurnOutcome:
        """Anthropic, Chat or Gemini to a streaming client. What the client got is kept
        (bounded). Up to 256 KiB it goes to storage as it is, parsed where the
        turn is written; its usage is the live round's when the answer went out
        in one round as it came, else read here from the usage events alone. A
        larger answer is parsed in a thread here, not copied across."""
        headers = client_response_headers(resp.raw_headers)
        tee = _Tee(client)
        handler = _MESSAGE_HANDLERS[exchange.protocol]
        one_round = await handler.stream_recall(ctx, resp, tee, headers)
        if sum(map(len, tee.chunks)) > RAW_OUTPUT_MAX_BYTES:
            outputs, usage = await _outputs(exchange.protocol, tee.chunks)
            return TurnOutcome(True, place_recalls(outputs, _recall_rows(ctx)), usage=usage,
                               follow_ups=_follow_ups(ctx))
        body = b"".join(tee.chunks)
        # Answered in one round as it came: the round read the usage already.
        usage = (one_round.usage if one_round is not None
                 else stream_usage(exchange.protocol, body))
        raw = RawOutputs(exchange.protocol.value, body, _recall_rows(ctx))
        return TurnOutcome(True, raw=raw, usage=usage, follow_ups=_follow_ups(ctx))

    async def _buffered_responses(self, exchange: Exchange, ctx: RecallContext,
                                  principal: dict[str, Any], client: ClientChannel) -> TurnOutcome:
        status, extra, body, final = await buffered_responses_recall(
            ctx, principal, codex=exchange.protocol is Protocol.CODEX)
        await client.respond(status, body, JSON_HEADERS + extra)
        if final is None:
            return TurnOutcome(False)
        ctx.delivered()
        _check_empty(exchange, final, ctx.budget.executions)
        calls = {s.anchor_id: s.assistant for s in ctx.staged if s.anchor_id}
        return TurnOutcome(True, turn_messages(final.get("output") or [], calls),
                           usage=_responses_usage(final), follow_ups=_follow_ups(ctx))

    async def _buffered_messages(self, exchange: Exchange, ctx: RecallContext,
                                 principal: dict[str, Any], client: ClientChannel) -> TurnOutcome:
        handler = _MESSAGE_HANDLERS[exchange.protocol]
        status, body, headers = await handler.buffered_recall(ctx, principal)
        await client.respond(status, body, headers)
        if status != 200:
            return TurnOutcome(False)
        ctx.delivered()
        outputs, usage = await _outputs(exchange.protocol, [body])
        return TurnOutcome(True, place_recalls(outputs, _recall_rows(ctx)), usage=usage,
                           follow_ups=_follow_ups(ctx))

    def _delivered(self, exchange: Exchange, staged: list[StagedRecall]) -> None:
        """The client has the whole answer: keep its recalls for expansion (not for
        a turn memory does not keep: its recall pairs are not replayed later, and
        the client's history carries the marker line in their place)."""
        if not exchange.keep:
            return
        family = family_of(exchange.protocol)
        self.replay.commit(family, exchange.payload, exchange.identity, staged)


def _live_limits(settings: Settings) -> Limits:
    """The live recall limits from the settings (E.1)."""
    return Limits(stream_bytes=settings.recall_stream_max_bytes,
                  retained_bytes=settings.recall_retained_max_bytes,
                  deferred_bytes=settings.recall_deferred_max_bytes)


# What a streamed recall answer may keep for storage: the client's bytes, parsed
# once it has them all. A recall-watched stream retains at most
# LORE_RECALL_RETAINED_MAX_BYTES of text; its SSE framing is a few times that.
MAX_KEPT_STREAM_BYTES = 64 * 1024 * 1024


class _Tee:
    """The client channel, keeping a copy of every byte written (bounded)."""

    def __init__(self, client: ClientChannel) -> None:
        self._client = client
        self.chunks: list[bytes] = []
        self._kept = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await self._client.start(status, headers)

    async def write(self, data: bytes) -> None:
        await self._client.write(data)
        self._keep(data)

    async def end(self, data: bytes = b"") -> None:
        await self._client.end(data)
        self._keep(data)

    def _keep(self, data: bytes) -> None:
        if data and self._kept + len(data) <= MAX_KEPT_STREAM_BYTES:
            self.chunks.append(data)
            self._kept += len(data)


# Answers up to this size are parsed for storage right away (about a millisecond);
# larger ones in a thread, so the loop never stalls on one (the proxy's rule for
# request bodies). Right away matters: a gateway stopped just after the client's
# last byte still completes the turn.
PARSE_OFF_LOOP_BYTES = 256 * 1024


def _follow_ups(ctx: RecallContext) -> bool:
    """Whether a recall ran (then the usage is not the first request's alone)."""
    return ctx.budget.executions > 0


async def _outputs(protocol: Protocol,
                   chunks: list[bytes]) -> tuple[list[Message], Usage | None]:
    if sum(map(len, chunks)) <= PARSE_OFF_LOOP_BYTES:
        return _parsed_outputs(protocol, chunks)
    return await asyncio.to_thread(_parsed_outputs, protocol, chunks)


def _parsed_outputs(protocol: Protocol,
                    chunks: list[bytes]) -> tuple[list[Message], Usage | None]:
    """What the client received, as the turn's output messages, and its usage
    (run off the loop)."""
    collector = TurnCollector(protocol, max_json_bytes=sum(map(len, chunks)) + 1)
    for chunk in chunks:
        collector.feed(chunk)
    return collector.outputs(), collector.usage()


def _responses_usage(response: dict[str, Any]) -> Usage | None:
    """The usage of a delivered Responses answer (None when it carries none)."""
    try:
        return usage_from_responses(response.get("usage"))
    except Exception:
        return None


async def _principal_json(exchange: Exchange, resp: UpstreamResponse,
                          collector: TurnCollector) -> dict[str, Any]:
    """The principal answer as one JSON object (a Codex stream is accumulated)."""
    if exchange.upstream_stream:
        async for chunk in resp.chunks():
            collector.feed(chunk)
        return collector.response_body()
    return await read_json_principal(resp)


def _check_empty(exchange: Exchange, response: dict[str, Any], depth: int) -> None:
    """Empty-completion telemetry for a delivered Responses answer (never raises)."""
    session = exchange.identity.session if exchange.identity is not None else ""
    telemetry.check_responses(response, protocol=exchange.protocol.value, session=session,
                              recall_depth=depth)


def _recall_rows(ctx: RecallContext) -> tuple[RecallRow, ...]:
    """The recall calls of a turn, as storage text, each with the anchor of its
    marker (where storage puts it: ``memory/store/recall_order.py``). Results are left
    out: they are copies of stored memory, and storing them again would make
    every later search find its own echo."""
    return tuple(RecallRow(s.anchor_id,
                           Message("assistant", f"[tool_call:recall] {s.call.arguments}"))
                 for s in ctx.staged)
