"""From relayed bytes to stored turns.

The proxy relays bytes untouched; a ``TurnCollector`` watches the same bytes and
accumulates them into the protocol's complete response, so the finished turn
(new user input + the assistant's full output) can be handed to memory. A
collector never raises into the relay: if the stream cannot be understood, the
client still gets every byte and the turn is stored as incomplete.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import orjson

from lore_gateway.errors import GatewayError
from lore_gateway.exchange import Exchange
from lore_gateway.knowledge.sidechannel import is_coding_turn
from lore_gateway.memory.records import Identity
from lore_gateway.memory.service import Memory, PendingTurn
from lore_gateway.obs import metrics
from lore_gateway.obs.logging import bind_session
from lore_gateway.protocols import anthropic, chat, responses
from lore_gateway.protocols.common import Message
from lore_gateway.protocols.usage import Usage
from lore_gateway.routing import Family, Protocol, Route, family_of
from lore_gateway.sse import SSEDecoder, looks_like_sse

log = logging.getLogger("lore.turns")

# Longest a new request waits for the memory writer to catch up (TurnSink.admit):
# long enough to ride out a burst, short enough that an overloaded disk never
# stops the agent for long. Polled, since the writer is another thread.
ADMIT_WAIT_S = 30.0
ADMIT_POLL_S = 0.02

class _Model:
    """How the collector drives one protocol model: the accumulator to build
    and how to read a turn out of it. Accumulation for storage is always in the
    lenient mode: storage wants what the client got, not a protocol verdict."""

    def __init__(self, protocol: Protocol) -> None:
        self.module = _MODULES[family_of(protocol)]
        self.name = family_of(protocol).value

    def accumulator(self, max_text_chars: int | None) -> Any:
        if self.name == "responses":
            return self.module.ResponsesAccumulator(mode="codex", max_text_chars=max_text_chars)
        if self.name == "anthropic":
            return self.module.AnthropicAccumulator(max_text_chars=max_text_chars)
        return self.module.ChatAccumulator(max_text_chars=max_text_chars)

    def response_body(self, acc: Any) -> dict[str, Any]:
        body: dict[str, Any] = acc.response_body()
        return body


# The protocol model of each wire-format family.
_MODULES: dict[Family, ModuleType] = {
    Family.RESPONSES: responses,
    Family.CHAT: chat,
    Family.ANTHROPIC: anthropic,
}
_MODELS: dict[Protocol, _Model] = {}


def _model(protocol: Protocol) -> _Model:
    model = _MODELS.get(protocol)
    if model is None:
        model = _MODELS[protocol] = _Model(protocol)
    return model


class TurnCollector:
    """Accumulates one upstream response (SSE or JSON) as it is relayed."""

    def __init__(self, protocol: Protocol, *, max_json_bytes: int,
                 max_text_chars: int | None = None) -> None:
        """``max_text_chars`` bounds the answer text kept (storage caps messages
        anyway); None keeps all of it, for a collector whose body is the reply."""
        self._model = _model(protocol)
        self._max_json_bytes = max_json_bytes
        self._max_text = max_text_chars
        # A Responses stream repeats every delta's text in its ``*.done`` events
        # (``output_text.done``, ``output_item.done``), so storage skips the deltas:
        # most of the events, and most of the parsing cost. The price: an answer
        # cut off before its done events is stored without its partial text.
        self._skip_deltas = max_text_chars is not None and self._model.name == "responses"
        self._sse: SSEDecoder | None = None
        self._acc: Any = None
        # Earlier messages of the same stream: the gateway's own recall stream to an
        # Anthropic client holds three (preamble, marker, continuation).
        self._earlier: list[Any] = []
        self._json: bytearray | None = None
        self.error: Exception | None = None

    def feed(self, chunk: bytes) -> None:
        if self.error is not None:
            return
        try:
            if self._sse is None and self._json is None:
                if looks_like_sse(chunk[:64]):
                    self._sse = SSEDecoder()
                    self._acc = self._model.accumulator(self._max_text)
                else:
                    self._json = bytearray()
            if self._sse is not None:
                for event in self._sse.feed(chunk):
                    if self._skip_deltas and event.event and event.event.endswith(".delta"):
                        continue
                    if self._acc.done and event.event == "message_start":
                        self._earlier.append(self._acc)
                        self._acc = self._model.accumulator(self._max_text)
                    self._acc.feed_event(event)
            else:
                assert self._json is not None
                if len(self._json) + len(chunk) > self._max_json_bytes:
                    raise ValueError("response body exceeds the storage accumulation limit")
                self._json += chunk
        except Exception as exc:
            self.error = exc
            log.debug("turn collector stopped: %s", exc)

    def _finish(self) -> None:
        if self._sse is not None and self.error is None:
            try:
                for event in self._sse.close():
                    self._acc.feed_event(event)
                self._acc.close()
            except Exception as exc:
                self.error = exc
            self._sse = None

    def response_body(self) -> dict[str, Any]:
        """The complete non-stream body (the Codex backend's stream answered as JSON)."""
        self._finish()
        if self.error is not None:
            raise self.error
        if self._acc is None:
            raise ValueError("the upstream sent no event stream")
        return self._model.response_body(self._acc)

    def usage(self) -> Usage | None:
        """The usage the upstream reported last (None when it sent none)."""
        usage = None
        with contextlib.suppress(Exception):
            for acc in [*self._earlier, self._acc]:
                if acc is not None and acc.result().usage is not None:
                    usage = acc.result().usage
        return usage

    def report_usage(self, protocol: str) -> None:
        """Feed the prompt-cache metrics from the usage the upstream reported."""
        usage = self.usage()
        if usage is not None:
            metrics.record_usage(protocol, usage.prompt_tokens, usage.cache_read or 0,
                                 usage.output_tokens)

    def response_id(self) -> str | None:
        """The upstream response's id, once the stream carried it (Responses only)."""
        try:
            if self._acc is not None and self._model.name == "responses":
                rid = self._acc.result().id
                return rid if isinstance(rid, str) and rid else None
        except Exception:
            return None
        return None

    def _accumulate_body(self, body: dict[str, Any]) -> None:
        """Run a non-stream body through the same accumulator as a stream (via the
        model's stream synthesiser), so every stored turn is built one way."""
        self._acc = self._model.accumulator(self._max_text)
        decoder = SSEDecoder()
        for frame in self._model.module.stream_from_response(body):
            for event in decoder.feed(frame):
                self._acc.feed_event(event)
        self._acc.close()

    def outputs(self) -> list[Message]:
        """The assistant's output so far (complete after a successful relay)."""
        self._finish()
        try:
            if self._acc is None and self._json:
                self._accumulate_body(orjson.loads(self._json))
            if self._acc is not None:
                out: list[Message] = []
                for acc in [*self._earlier, self._acc]:
                    out.extend(self._model.module.output_messages(acc))
                return out
        except Exception as exc:
            log.debug("could not extract output messages: %s", exc)
        return []


class TurnSink:
    """Where the proxy reports turns. Without memory every call is a no-op."""

    def __init__(self, memory: Memory | None, *, max_json_bytes: int,
                 max_stored_chars: int | None = None) -> None:
        self.memory = memory
        self._max_json_bytes = max_json_bytes
        self._max_stored_chars = max_stored_chars

    async def admit(self, in_flight: int) -> None:
        """Back-pressure: while the writer's queue could not take the turns of the
        ``in_flight`` requests already running, hold this request back (at most
        ``ADMIT_WAIT_S``), so a writer that falls behind slows new traffic instead
        of dropping stored turns. Forwarding never waits longer than that: past
        it the request goes on and a full queue drops (and counts) its turn."""
        if self.memory is None or not self.memory.backlogged(in_flight):
            return
        deadline = time.monotonic() + ADMIT_WAIT_S
        log.info("memory writer is behind (%d queued); holding a request back",
                 self.memory.queue_depth)
        while self.memory.backlogged(in_flight) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(ADMIT_POLL_S)

    def identify(self, route: Route, headers: Mapping[str, str],
                 payload: dict[str, Any]) -> Identity | None:
        if self.memory is None or route.protocol is None:
            return None
        try:
            identity = self.memory.identify(route.protocol.value, headers, payload)
        except GatewayError:
            raise  # team mode without a valid key: the request is refused (401)
        except Exception:
            log.exception("could not identify the session; the turn will not be stored")
            return None
        bind_session(identity.session)
        return identity

    def collector(self, exchange: Exchange,
                  pending: PendingTurn | None) -> TurnCollector | None:
        """A collector when the response must be understood: for storage, or
        because the client asked for JSON and the upstream streams (Codex)."""
        whole = exchange.client_stream != exchange.upstream_stream or exchange.recall
        if pending is None and not whole:
            return None
        return TurnCollector(exchange.protocol, max_json_bytes=self._max_json_bytes,
                             max_text_chars=None if whole else self._max_stored_chars)

    def begin(self, exchange: Exchange) -> PendingTurn | None:
        """Start a pending turn with this request's new input (None without memory)."""
        if self.memory is None or exchange.identity is None:
            return None
        try:
            inputs = _model(exchange.protocol).module.new_input_messages(exchange.payload)
        except Exception:
            log.exception("could not read the turn's input messages")
            inputs = []
        family = {"anthropic": "anthropic", "chat": "chat"}.get(exchange.protocol.value,
                                                                "responses")
        return self.memory.begin_turn(
            exchange.identity, protocol=exchange.protocol.value, model=exchange.model,
            inputs=inputs,
            side_channel=not is_coding_turn(family, exchange.payload, exchange.header_map),
        )

    @staticmethod
    def finish(pending: PendingTurn | None, outputs: list[Message], *, complete: bool) -> None:
        if pending is not None:
            if complete:
                pending.complete(outputs)
            else:
                pending.abandon(outputs)

    @staticmethod
    def completed(pending: PendingTurn | None, collector: TurnCollector | None) -> None:
        if pending is not None and collector is not None:
            pending.complete(collector.outputs())
            collector.report_usage(pending.protocol)

    @staticmethod
    def abandoned(pending: PendingTurn | None, collector: TurnCollector | None = None) -> None:
        if pending is not None:
            pending.abandon(collector.outputs() if collector is not None else ())
