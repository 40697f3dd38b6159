"""The plain delivery paths of a model request (no recall tool): the answer
relayed as it comes, JSON made from an upstream stream, an upstream error passed
on. Each comes to one ``TurnOutcome`` (turns.py), as the recall paths do
(recall/service.py); the proxy ends the turn with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter

import orjson

from lore_gateway.channel import ClientChannel
from lore_gateway.collector import stream_usage
from lore_gateway.errors import error_body
from lore_gateway.exchange import Exchange
from lore_gateway.headers import client_response_headers
from lore_gateway.memory.store.records import RAW_OUTPUT_MAX_BYTES, RawOutputs
from lore_gateway.memory.store.sanitize import redact_credentials, storable
from lore_gateway.routing import Protocol
from lore_gateway.sse import encode_event
from lore_gateway.turns import TurnCollector, TurnOutcome
from lore_gateway.upstream import UpstreamBroken, UpstreamResponse

log = logging.getLogger("lore.proxy")

# Relayed bytes held back until the response is done: handed to storage as they
# are, or, past this, fed to the storage collector here as they pile up.
_UNFED_LIMIT = RAW_OUTPUT_MAX_BYTES


@dataclass(slots=True)
class RequestTiming:
    """What the metrics need from one request: its status and where time went."""

    status: int = 0
    ttfb: float | None = None  # upstream: request sent -> response headers
    upstream_wait: float = 0.0  # all time spent waiting on the upstream

    def overhead(self, total: float) -> float | None:
        """Time the gateway itself added: the total minus the upstream wait."""
        return total - self.upstream_wait if self.ttfb is not None else None


async def relay(exchange: Exchange, resp: UpstreamResponse, client: ClientChannel,
                collector: TurnCollector | None, timing: RequestTiming) -> TurnOutcome:
    """Forward the body as it arrives, byte for byte, for the collector.

    Incomplete when the upstream broke mid-body. An event stream storage
    takes as the client got it (up to ``_UNFED_LIMIT``) is parsed where the
    turn is written, and only its usage read here (``stream_usage``);
    otherwise the collector was fed here. An event stream
    broken between two events ends with one protocol error event, so SDKs
    raise a clear error; one broken mid-event (or a JSON body) is aborted,
    so the client sees a truncated response rather than a complete-looking
    one.
    """
    await client.start(resp.status, client_response_headers(resp.raw_headers))
    chunks = resp.chunks()
    tail = b"\n\n"
    # Chunks wait here for the collector until the client has them all (or
    # this much piled up): parsing for storage never delays a byte.
    unfed: list[bytes] = []
    unfed_bytes = 0
    keep = (collector is not None and exchange.client_stream and exchange.upstream_stream
            and "event-stream" in resp.content_type)
    while True:
        waited = perf_counter()
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except UpstreamBroken as exc:
            log.warning("upstream broke mid-response: %s", exc)
            _feed(collector, unfed)
            frame = None
            if "event-stream" in resp.content_type and tail.endswith((b"\n\n", b"\r\r")):
                frame = broken_stream_event(
                    exchange.protocol, collector, f"{BROKEN_STREAM_MESSAGE} ({exc})")
            if frame is None:
                raise
            await client.end(frame)
            return TurnOutcome.cut(collector)
        timing.upstream_wait += perf_counter() - waited
        await client.write(chunk)
        tail = chunk[-4:]
        if collector is not None:
            unfed.append(chunk)
            unfed_bytes += len(chunk)
            if unfed_bytes > _UNFED_LIMIT:
                _feed(collector, unfed)
                unfed_bytes = 0
                keep = False
    await client.end()
    if keep:
        stream = b"".join(unfed)
        return TurnOutcome(True, raw=RawOutputs(exchange.protocol.value, stream, ()),
                           usage=stream_usage(exchange.protocol, stream))
    _feed(collector, unfed)
    if collector is None:
        return TurnOutcome(True)
    return TurnOutcome(True, collector.outputs(), usage=collector.usage())

async def answer_json_from_stream(exchange: Exchange, resp: UpstreamResponse,
                                  client: ClientChannel, collector: TurnCollector | None,
                                  timing: RequestTiming) -> TurnOutcome:
    """The Codex backend only streams; a non-streaming client gets the JSON it asked for."""
    assert collector is not None
    waited = perf_counter()
    async for chunk in resp.chunks():
        collector.feed(chunk)
    timing.upstream_wait += perf_counter() - waited
    try:
        body = collector.response_body()
    except Exception as exc:
        await client.respond(502, error_body(
            "api_error", f"The upstream stream could not be turned into a response: {exc}"))
        return TurnOutcome(False)
    await client.respond(200, orjson.dumps(body))
    # The collector is there for the JSON; its messages only for a turn memory keeps.
    outputs = collector.outputs() if exchange.keep else ()
    return TurnOutcome(True, outputs, usage=collector.usage())

async def relay_error(resp: UpstreamResponse, client: ClientChannel, limit: int) -> TurnOutcome:
    """Upstream errors reach the client unchanged, bounded to ``limit`` bytes
    (``LORE_MAX_ERROR_BODY_BYTES``); no turn came of it."""
    body, cut = await resp.read(limit)
    await client.respond(resp.status, body, error_headers(resp, cut))
    return TurnOutcome(False)


def error_headers(resp: UpstreamResponse, cut: bool) -> list[tuple[bytes, bytes]]:
    """An upstream error's headers as the client gets them, marked when its body
    was cut at ``max_error_body_bytes``."""
    headers = client_response_headers(resp.raw_headers)
    if cut:
        headers.append((b"x-lore-body-truncated", b"true"))
    return headers


def _feed(collector: TurnCollector | None, chunks: list[bytes]) -> None:
    if collector is not None:
        for chunk in chunks:
            collector.feed(chunk)
    chunks.clear()


BROKEN_STREAM_MESSAGE = "Gateway request failed: the upstream connection broke mid-response"


def broken_stream_event(protocol: Protocol, collector: TurnCollector | None,
                        message: str = BROKEN_STREAM_MESSAGE) -> bytes:
    """The error event a client of ``protocol`` understands, ending a broken stream.

    ``message`` says why; it never quotes a header, so it never holds a credential
    (``redact_credentials`` runs over it anyway, as a last line of defence)."""
    message = redact_credentials(storable(message))
    if protocol is Protocol.ANTHROPIC:
        return encode_event("error", orjson.dumps({"type": "error", "error": {
            "type": "api_error", "message": message}}))
    if protocol is Protocol.GEMINI:
        # The API's own error object, as a data-only record (alt=sse).
        return b"data: " + orjson.dumps({"error": {
            "code": 502, "message": message, "status": "UNAVAILABLE"}}) + b"\r\n\r\n"
    if protocol is Protocol.CHAT:
        # Chat streams are data-only; the openai SDK raises on an "error" object.
        return b"data: " + orjson.dumps({"error": {
            "type": "server_error", "message": message}}) + b"\n\n"
    response_id = (collector.response_id() if collector is not None else None) or "resp_error"
    return encode_event("response.failed", orjson.dumps({"type": "response.failed", "response": {
        "id": response_id, "object": "response", "status": "failed", "output": [],
        "usage": None, "error": {"code": "server_error", "message": message}}}))
