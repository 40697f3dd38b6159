"""From relayed bytes to stored turns: the proxy's side of storage.

The proxy relays bytes untouched and hands the finished turn (new user input +
the assistant's full output) to memory. Every delivery path (the plain relay,
JSON from a stream, each recall path) ends in one :class:`TurnOutcome`, and
``TurnSink.end`` is the one way a turn ends: a streamed answer as the bytes the
client got, parsed where the turn is written (``TurnOutcome.raw``), any other
as the output messages a ``TurnCollector`` (collector.py) accumulated from the
same bytes. A collector never raises into the relay: if the stream cannot be
understood, the client still gets every byte and the turn is stored as
incomplete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from lore_gateway.collector import TurnCollector, model_of, report_usage
from lore_gateway.errors import GatewayError
from lore_gateway.exchange import Exchange
from lore_gateway.memory.data.amnesia import AmnesiaSwitch
from lore_gateway.memory.service import Memory, PendingTurn
from lore_gateway.memory.store.records import Identity, RawOutputs
from lore_gateway.obs.logging import bind_session
from lore_gateway.privacy import NO_STORE_HEADER, no_store_requested
from lore_gateway.protocols.common import Message
from lore_gateway.protocols.usage import Usage
from lore_gateway.routing import Protocol, Route

__all__ = ["TurnCollector", "TurnOutcome", "TurnSink"]

log = logging.getLogger("lore.turns")

# Longest a new request waits for the memory writer to catch up (TurnSink.admit):
# long enough to ride out a burst, short enough that an overloaded disk never
# stops the agent for long. Polled, since the writer is another thread.
ADMIT_WAIT_S = 30.0
ADMIT_POLL_S = 0.02


class TurnOutcome(msgspec.Struct, frozen=True):
    """What one response came to, whichever path delivered it.

    ``complete``: the client got a whole answer (else the turn is stored as
    incomplete, with what there is). ``outputs``: the turn's output messages;
    ``raw``: more output still as the bytes the client got, parsed where the turn
    is written (after ``outputs``). ``usage``: what the upstream reported, for the
    token metrics; ``follow_ups``: the gateway sent recall follow-ups, so that
    usage covers more than the request as it went out (``calibration``).
    """

    complete: bool
    outputs: Sequence[Message] = ()
    raw: RawOutputs | None = None
    usage: Usage | None = None
    follow_ups: bool = False

    @classmethod
    def cut(cls, collector: TurnCollector | None = None) -> TurnOutcome:
        """A response that did not end whole: what the collector read of it."""
        return cls(False, collector.outputs() if collector is not None else ())

    @property
    def calibration(self) -> Usage | None:
        """The usage of the request as sent (context management calibrates its
        estimate with it: context/service.py); None after recall follow-ups."""
        return None if self.follow_ups else self.usage


class TurnSink:
    """Where the proxy reports turns. Without memory every call is a no-op."""

    def __init__(self, memory: Memory | None, *, max_json_bytes: int,
                 max_stored_chars: int | None = None,
                 amnesia: AmnesiaSwitch | None = None) -> None:
        self.memory = memory
        # Sessions kept out of memory (`lore amnesia`, /ui); None: none ever are.
        self.amnesia = amnesia
        # The proxy marks each request's start and end here (memory/store/traffic.py).
        self.traffic = memory.traffic if memory is not None else None
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

    def keeps(self, identity: Identity | None, headers: Mapping[str, str]) -> bool:
        """Whether memory keeps this request's turn: not when it carries
        ``x-lore-no-store`` or its session is under amnesia (never blocks)."""
        if identity is None:
            return False
        if no_store_requested(headers):
            log.debug("turn not kept: %s", NO_STORE_HEADER)
            return False
        if self.amnesia is not None:
            covering = self.amnesia.active(identity.tenant, identity.session)
            if covering is not None:
                log.debug("turn not kept: amnesia (%s)", covering.scope)
                return False
        return True

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
        """Start a pending turn with this request's new input (None without memory,
        and for a turn memory does not keep: ``Exchange.keep``)."""
        if self.memory is None or exchange.identity is None or not exchange.keep:
            return None
        try:
            inputs = model_of(exchange.protocol).module.new_input_messages(exchange.payload)
        except Exception:
            log.exception("could not read the turn's input messages")
            inputs = []
        return self.memory.begin_turn(
            exchange.identity, protocol=exchange.protocol.value, model=exchange.model,
            inputs=inputs, side_channel=exchange.side_channel,
        )

    @staticmethod
    def end(pending: PendingTurn | None, outcome: TurnOutcome, protocol: Protocol) -> None:
        """End the turn (a no-op once it ended: a ``PendingTurn`` ends once) and
        count its usage in the token metrics (the overview's charts)."""
        if pending is not None:
            if outcome.complete:
                pending.complete(outcome.outputs, outcome.raw)
            else:
                pending.abandon(outcome.outputs)
        report_usage(protocol.value, outcome.usage)
