"""The request handlers: one client request, top to bottom.

``handle_model`` serves conversation turns (Responses, the Codex backend, Chat
Completions, Anthropic Messages) in three steps: ``prepare`` (read and decode
the body, parse it, and ask the request pipeline what goes upstream: usually
nothing changes), forward, and deliver (delivery.py relays the answer chunk by
chunk while a collector accumulates it, or recall serves it), which comes to one
``TurnOutcome`` for memory. ``handle_passthrough`` serves everything else under
``/v1/``: bytes in, bytes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

import orjson

from lore_gateway import delivery
from lore_gateway.body import ClientDisconnected, decode_body, read_body
from lore_gateway.channel import ClientChannel, ClientGone, Receive, Send, watch
from lore_gateway.collector import ends_with_terminal, terminal_marks
from lore_gateway.compaction.channel import ScaledUsageChannel
from lore_gateway.compaction.service import CompactionAnswer, CompactionService, usage_cap
from lore_gateway.config import Settings
from lore_gateway.delivery import BROKEN_STREAM_MESSAGE, RequestTiming, broken_stream_event
from lore_gateway.errors import GatewayError, error_body
from lore_gateway.exchange import Exchange, parse_payload
from lore_gateway.headers import client_response_headers, header_map, upstream_request_headers
from lore_gateway.knowledge.sidechannel import side_channel_reason
from lore_gateway.memory.service import PendingTurn
from lore_gateway.memory.store.sanitize import redact_credentials
from lore_gateway.pipeline.request import RequestPipeline
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.service import RecallService
from lore_gateway.routing import Protocol, Route, family_of
from lore_gateway.turns import TurnCollector, TurnOutcome, TurnSink
from lore_gateway.upstream import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamDisconnected,
    UpstreamResponse,
    UpstreamUnavailable,
)

log = logging.getLogger("lore.proxy")


class _SentTail:
    """ASGI ``send`` that remembers how the last body bytes ended, so an error
    event written after a cut (shutdown, a failure) starts on an event boundary,
    and whether a client that left had the whole answer (``delivered``)."""

    __slots__ = ("_before", "_last", "_send", "at_boundary", "ended", "sse")

    def __init__(self, send: Send) -> None:
        self._send = send
        # The last two body chunks: read only if the client leaves (``delivered``).
        self._before = self._last = b""
        self.at_boundary = True
        self.ended = False
        self.sse = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.sse = any(n.lower() == b"content-type" and b"event-stream" in v.lower()
                           for n, v in message.get("headers", ()))
        body = message.get("body")
        if body:
            self.at_boundary = body.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
            self._before, self._last = self._last, body
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    def delivered(self, marks: tuple[bytes, ...]) -> bool:
        """The client has the whole answer: the end of the body, or the stream's
        terminal frame last (``marks``: ``collector.terminal_marks``; a frame may
        straddle two chunks)."""
        return self.ended or (self.sse and ends_with_terminal(
            self._before[-_STRADDLE:] + self._last, marks))


_STRADDLE = 256  # bytes of the chunk before the last that a terminal mark may start in

SHUTDOWN_MESSAGE = ("The gateway is shutting down and ended this response; "
                    "retry the request once it is back")


class Proxy:
    """The request handlers of one gateway, built once (composition.py).

    ``pipeline`` shapes what goes upstream; ``recall`` serves answers to requests
    that carry its tool (None with recall off or without memory);
    ``compaction`` answers compaction requests from memory (None: no memory);
    ``on_response_ended`` is called once the client has a whole (2xx) response
    of a kept turn: background work (docs/knowledge.md) starts there and never
    earlier.
    """

    def __init__(self, settings: Settings, upstream: UpstreamClient, turns: TurnSink,
                 pipeline: RequestPipeline, *, recall: RecallService | None = None,
                 compaction: CompactionService | None = None,
                 on_response_ended: Callable[[Exchange], None] | None = None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.turns = turns
        self.pipeline = pipeline
        self.recall = recall
        self.compaction = compaction
        self.on_response_ended = on_response_ended
        # Relays in flight, so that shutdown can end them once the grace is over.
        self._relays: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._ending = False

    @property
    def active(self) -> int:
        return len(self._relays)

    async def wait_idle(self) -> None:
        """Until no relay is in flight."""
        await self._idle.wait()

    def end_streams(self) -> int:
        """End every relay in flight with its protocol's error event (shutdown,
        after the grace period); the number ended."""
        self._ending = True
        for relay in list(self._relays):
            relay.cancel(SHUTDOWN_MESSAGE)
        return len(self._relays)

    # -- model routes -------------------------------------------------------------

    async def handle_model(self, scope: dict[str, Any], receive: Receive, send: Send,
                           route: Route) -> RequestTiming:
        traffic = self.turns.traffic
        if traffic is not None:
            traffic.mark()  # the embedding backlog waits while requests come
        try:
            return await self._handle_model(scope, receive, send, route)
        finally:
            if traffic is not None:
                traffic.mark()

    async def _handle_model(self, scope: dict[str, Any], receive: Receive, send: Send,
                            route: Route) -> RequestTiming:
        tail = _SentTail(send)
        client = ClientChannel(tail)
        timing = RequestTiming()
        # Every request already running may still store a turn: room for all of them.
        await self.turns.admit(len(self._relays) + 1)
        try:
            exchange, compaction = await self.prepare(scope, receive, route)
        except ClientDisconnected:
            return timing
        except GatewayError as exc:
            await client.respond(exc.status, exc.body(), exc.headers())
            timing.status = exc.status
            return timing
        if compaction is not None and compaction.body is not None:
            await client.respond(compaction.status, compaction.body, compaction.headers)
            timing.status = client.status
            return timing
        cap = usage_cap(self.settings, exchange.protocol, exchange.header_map, exchange.payload)
        if cap is not None:
            client = ScaledUsageChannel(tail, cap)
        # A compaction passed through is not a turn of the conversation: not stored.
        pending = self.turns.begin(exchange) if compaction is None else None
        relay = asyncio.ensure_future(self._forward(exchange, client, tail, timing, pending))
        self._relays.add(relay)
        self._idle.clear()
        ended = False
        try:
            marks = terminal_marks(exchange.protocol, recall=exchange.recall)
            await watch(receive, relay, delivered=lambda: tail.delivered(marks))
            ended = True
        except ClientGone:
            log.info("client disconnected; upstream request cancelled")
        except asyncio.CancelledError:
            if not self._ending or _cancelling():
                raise
            if not await _end_with_error(client, tail, exchange.protocol, SHUTDOWN_MESSAGE, 503):
                raise
        finally:
            self._relays.discard(relay)
            if not self._relays:
                self._idle.set()
            # A no-op when the turn already ended (PendingTurn ends once).
            self.turns.end(pending, TurnOutcome(False), exchange.protocol)
        timing.status = client.status
        # Background work reads the stored turn: none for a turn memory does not keep.
        if (ended and exchange.keep and self.on_response_ended is not None
                and 200 <= client.status < 300):
            self.on_response_ended(exchange)
        return timing

    async def prepare(self, scope: dict[str, Any], receive: Receive,
                      route: Route) -> tuple[Exchange, CompactionAnswer | None]:
        """The parsed request and what goes upstream; a compaction request
        (compaction/) skips the request pipeline: answered from memory, or
        forwarded as the client sent it."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        hmap = header_map(headers)
        limit = self.settings.max_request_bytes
        raw = await read_body(receive, limit=limit, content_length=hmap.get("content-length"))
        body = decode_body(raw, hmap.get("content-encoding"), limit=limit)
        assert route.protocol is not None
        payload = await parse_payload(body, route.protocol)
        identity = self.turns.identify(route, hmap, payload)
        side = (side_channel_reason(family_of(route.protocol), payload, hmap)
                if identity is not None else None)
        coding = identity is not None and side is None
        keep = self.turns.keeps(identity, hmap)
        compaction = None
        if self.compaction is not None:
            compaction = await self.compaction.answer(route.protocol, payload, hmap, identity)
        prepared = await self.pipeline.prepare(route, hmap, payload,
                                               identity if compaction is None else None,
                                               body, coding=coding, keep=keep)
        upstream_payload = prepared.upstream_payload
        return Exchange(
            route=route,
            headers=headers,
            header_map=hmap,
            body=body,
            payload=payload,
            upstream_url=self.upstream.url(route.upstream, route.upstream_path),  # type: ignore[arg-type]
            upstream_headers=upstream_request_headers(headers),
            upstream_body=body if upstream_payload is None else orjson.dumps(upstream_payload),
            client_stream=route.streams(payload),
            upstream_stream=prepared.upstream_stream,
            identity=identity,
            coding=coding,
            side_channel=side,
            upstream_payload=upstream_payload,
            recall=prepared.inject,
            keep=keep,
        ), compaction

    async def _forward(self, exchange: Exchange, client: ClientChannel, tail: _SentTail,
                       timing: RequestTiming, pending: PendingTurn | None) -> None:
        sent = perf_counter()
        try:
            resp = await self._send(exchange)
            if resp.status in (400, 413) and self.pipeline.manages(exchange):
                # A context-length error is retried once at a higher context layer.
                body, cut = await resp.read(self.settings.max_error_body_bytes)
                resp.close()
                if cut or not await self.pipeline.retry_overflow(exchange, resp.status, body):
                    await client.respond(resp.status, body, delivery.error_headers(resp, cut))
                    return
                resp = await self._send(exchange)
        except UpstreamUnavailable as exc:
            await client.respond(502, _unreachable(exchange, exc))
            return
        timing.ttfb = perf_counter() - sent
        timing.upstream_wait += timing.ttfb
        collector = self.turns.collector(exchange, pending)
        try:
            outcome = await self._deliver(exchange, resp, client, timing, collector)
        except UpstreamBroken as exc:
            self._cut(exchange, pending, collector)
            if not await _end_with_error(client, tail, exchange.protocol,
                                         f"{BROKEN_STREAM_MESSAGE} ({exc})", 502):
                raise
        except (ProtocolError, ValueError) as exc:
            # A handler that reads the upstream's events met one it cannot read:
            # the client learns which, not just that something failed.
            self._cut(exchange, pending, collector)
            log.warning("upstream protocol violation: %s", exc)
            if not await _end_with_error(client, tail, exchange.protocol,
                                         f"The upstream broke the protocol: {exc}", 502):
                raise
        except BaseException:
            self._cut(exchange, pending, collector)
            raise
        else:
            self.turns.end(pending, outcome, exchange.protocol)
            self.pipeline.observe(exchange, outcome)
        finally:
            resp.close()

    def _cut(self, exchange: Exchange, pending: PendingTurn | None,
             collector: TurnCollector | None) -> None:
        """End a turn its delivery did not finish with what the collector read of
        it (read only when there is a turn to store)."""
        self.turns.end(pending, TurnOutcome.cut(collector if pending is not None else None),
                       exchange.protocol)

    async def _send(self, exchange: Exchange) -> UpstreamResponse:
        return await self.upstream.send("POST", exchange.upstream_url,
                                        exchange.upstream_headers, exchange.upstream_body)

    async def _deliver(self, exchange: Exchange, resp: UpstreamResponse, client: ClientChannel,
                       timing: RequestTiming, collector: TurnCollector | None) -> TurnOutcome:
        """Serve the upstream's answer; what it came to, for memory and calibration."""
        if resp.status >= 300:
            return await delivery.relay_error(resp, client, self.settings.max_error_body_bytes)
        if exchange.recall:
            assert self.recall is not None and collector is not None
            assert exchange.upstream_payload is not None
            return await self.recall.respond(
                exchange, resp, client, exchange.upstream_payload, collector)
        if exchange.client_stream or not exchange.upstream_stream:
            return await delivery.relay(exchange, resp, client, collector, timing)
        return await delivery.answer_json_from_stream(exchange, resp, client, collector, timing)

    async def handle_compact(self, scope: dict[str, Any], receive: Receive, send: Send,
                             route: Route) -> int:
        """Codex's ``POST …/responses/compact``: the new history from memory, or
        (no memory of the session) the request forwarded as is."""
        client = ClientChannel(send)
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        hmap = header_map(headers)
        limit = self.settings.max_request_bytes
        try:
            raw = await read_body(receive, limit=limit, content_length=hmap.get("content-length"))
            body = decode_body(raw, hmap.get("content-encoding"), limit=limit)
            payload = orjson.loads(body) if body else {}
            # Team mode: a request without a valid gateway key is refused here (401).
            identity = (self.turns.identify(route, hmap, payload)
                        if isinstance(payload, dict) else None)
        except ClientDisconnected:
            return 0
        except GatewayError as exc:
            await client.respond(exc.status, exc.body(), exc.headers())
            return exc.status
        except orjson.JSONDecodeError as exc:
            await client.respond(400, error_body("invalid_request_error",
                                                 f"Invalid JSON body: {exc}"))
            return 400
        answer = None
        if self.compaction is not None:
            answer = await self.compaction.compact_endpoint(identity)
        if answer is not None:
            await client.respond(200, answer)
            return client.status
        url = self.upstream.url(route.upstream, route.upstream_path)  # type: ignore[arg-type]
        with contextlib.suppress(ClientGone):
            await watch(receive, self._passthrough("POST", url, headers, body, client))
        return client.status

    # -- everything else under /v1/ -------------------------------------------------

    async def handle_passthrough(self, scope: dict[str, Any], receive: Receive, send: Send,
                                 route: Route) -> int:
        """Forward any other request as is; return the status the client got."""
        client = ClientChannel(send)
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        hmap = header_map(headers)
        limit = self.settings.max_request_bytes
        try:
            raw = await read_body(receive, limit=limit, content_length=hmap.get("content-length"))
            body = decode_body(raw, hmap.get("content-encoding"), limit=limit)
        except ClientDisconnected:
            return 0
        except GatewayError as exc:
            await client.respond(exc.status, exc.body())
            return exc.status
        url = self.upstream.url(route.upstream, route.upstream_path)  # type: ignore[arg-type]
        method: str = scope["method"]
        with contextlib.suppress(ClientGone):
            await watch(receive, self._passthrough(method, url, headers, body, client))
        return client.status

    async def _passthrough(self, method: str, url: str, headers: list[tuple[bytes, bytes]],
                           body: bytes, client: ClientChannel) -> None:
        try:
            resp = await self.upstream.send(
                method, url, upstream_request_headers(headers), body or None
            )
        except UpstreamUnavailable as exc:
            await client.respond(502, error_body(
                "api_error", f"Could not reach the upstream {redact_credentials(url)}: {exc}"))
            return
        try:
            await client.start(resp.status, client_response_headers(resp.raw_headers))
            async for chunk in resp.chunks():
                await client.write(chunk)
            await client.end()
        finally:
            resp.close()


def _unreachable(exchange: Exchange, exc: Exception) -> bytes:
    # The URL may carry a Gemini ``?key=``: never shown.
    url = redact_credentials(exchange.upstream_url)
    if isinstance(exc, UpstreamDisconnected):
        return error_body(
            "api_error",
            f"The upstream {url} closed the connection before answering "
            f"({exc}); retry the request.")
    return error_body(
        "api_error",
        f"Could not reach the upstream {url}: {exc}. "
        "Check the LORE_UPSTREAM_* settings and your network.",
    )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _end_with_error(client: ClientChannel, tail: _SentTail, protocol: Protocol,
                          message: str, status: int) -> bool:
    """End the response with ``message``: an error body when nothing was sent yet,
    the protocol's error event when a stream stopped on an event boundary.

    False when neither fits (a JSON body or an event cut halfway): the caller
    aborts the connection, so the client sees a truncated response rather than a
    complete-looking one."""
    if tail.ended:
        return True
    if not client.started:
        await client.respond(status, error_body("api_error", redact_credentials(message)))
        return True
    if not tail.sse or not tail.at_boundary:
        return False
    with contextlib.suppress(Exception):
        await client.end(broken_stream_event(protocol, None, message))
    return True
