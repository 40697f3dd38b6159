"""Live recall interception on a Responses stream (lore-spec C.5), sans-IO.

:class:`LiveInterceptor` is a state machine in the style of h11. The asyncio shell
(:mod:`lore_gateway.recall.responses.handler`) feeds it upstream SSE events and
carries out the actions it returns:

* :class:`Send` — bytes for the client;
* ``RunRecall`` — execute this recall, then call :meth:`recall_done`;
* ``FollowUp`` — send a follow-up whose input is the original input plus
  these items, feed its events, then call :meth:`end_of_stream`;
* :class:`Done` — the client has the whole answer (``ok``: commit staged recalls).

``RunRecall`` and ``FollowUp`` are the core chain machine's actions: which one
comes next is decided by :class:`~lore_gateway.recall.core.machine.ChainMachine`,
as on every other path (:mod:`~.adapter`).

What the client sees: events stream live until a recall appears. The recall's own
events (added, argument deltas, done) are hidden; everything after it is deferred
(bounded) until the round ends. A recall-only round is followed by a follow-up whose
events are spooled; when the chain succeeds the client gets the anchor item, the
spooled continuation and one rebuilt terminal carrying the principal's response id
and the merged usage. ``output_index`` is renumbered to visible positions and
``sequence_number`` kept contiguous. If the chain fails after one recovery attempt,
the client gets one ``response.failed``.

Every event, forwarded, deferred or hidden, is applied to the round's item state;
:meth:`LiveInterceptor.turn_items` is the whole turn (recall calls and results
included) for storage.

Five layers, one object: :class:`~.emission.ClientEmission` (the client's
numbering, deferral, spooling and synthetic frames), :class:`~.items.ItemTracking`
(item events applied to the round's ``ResponsesAccumulator``, recalls marked
hidden), :class:`~.handover.Handover` (reads relayed untouched by a gate, and
taking the stream over from it), :class:`~.adapter.ChainAdapter` (the rounds on
the chain machine) and this class (feeding: frames, lifecycle, terminals; the
turn for storage).
"""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.ratelimits import RateLimitLog, sanitize_rate_limits
from lore_gateway.protocols.usage import (
    Usage,
    merge_usage,
    usage_from_responses,
    usage_to_responses,
)
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import RecallFailed
from lore_gateway.recall.core.machine import Deliver, FollowUp, Round, RunRecall
from lore_gateway.recall.responses.adapter import ChainAdapter
from lore_gateway.recall.responses.round import (
    RATE_LIMITS,
    TERMINALS,
    Action,
    Done,
    Limits,
    Send,
)
from lore_gateway.sse import SSEEvent

__all__ = [
    "Action",
    "Done",
    "FollowUp",
    "Limits",
    "LiveInterceptor",
    "RunRecall",
    "Send",
]

_TEXT_DELTAS = frozenset({
    "response.output_text.delta",
    "response.refusal.delta",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
})


class LiveInterceptor(ChainAdapter):
    """One streaming client request whose upstream got the recall tool."""

    def __init__(
        self,
        *,
        budget: RecallChainBudget,
        codex: bool = False,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(limits or Limits(), budget)
        self._codex = codex
        self.response_id: str | None = None
        self._created_at: Any = None
        self._model: Any = None
        self._created_sent = False
        self._pre_created: list[bytes] = []
        # The principal had no recall and its terminal went out verbatim: whatever
        # the upstream sends after it is relayed raw, as plain passthrough would.
        self._relaying = False
        self._stream_bytes = 0
        self.rate_limits = RateLimitLog()

    # --- feeding ------------------------------------------------------------------

    @property
    def relaying(self) -> bool:
        """True once the answer needed no recall and its terminal was forwarded:
        the rest of the upstream body is plain passthrough."""
        return self._relaying

    @property
    def in_continuation(self) -> bool:
        """Whether the stream being fed is a follow-up's (not the principal's)."""
        return self._round.number > 0

    def feed(self, event: SSEEvent) -> list[Action]:
        """Apply one upstream event of the current round."""
        if self._relaying:
            return [Send(event.raw)]
        if self._state == "done":
            return []
        try:
            return self._feed(event)
        except RecallFailed as exc:
            return self._fail(exc.category, str(exc))
        except ProtocolError as exc:
            return self._fail(
                "follow_up_protocol" if self._round.number else "principal_protocol", str(exc)
            )

    def feed_all(self, events: list[SSEEvent]) -> list[Action]:
        """``feed`` over one upstream read: the same actions, except that the text
        deltas forwarded untouched (most of a stream, see ``_deltas_pass``) come as
        one ``Send`` of their bytes, in order, instead of one each. A delta that
        does not pass the cheap check goes through ``feed``, which gives it the
        same failure it always got."""
        out: list[Action] = []
        run: list[bytes] = []
        passing: bool | None = None  # _deltas_pass(), until a non-delta event runs
        limit = self._limits.stream_bytes
        for event in events:
            if (event.event in _TEXT_DELTAS and not self._relaying and self._state != "done"
                    and self._round.terminal_name is None
                    and self._stream_bytes + len(event.raw) <= limit):
                if passing is None:
                    passing = self._deltas_pass()
                if passing:
                    seq = self._checked_delta(event)
                    if seq is not False:
                        self._stream_bytes += len(event.raw)
                        if seq is not None:
                            self._seq = seq + 1
                        run.append(event.raw)
                        continue
            if run:
                out.append(Send(b"".join(run)))
                run = []
            out.extend(self.feed(event))
            passing = None
        if run:
            out.append(Send(b"".join(run)))
        return out

    def end_of_stream(self) -> list[Action]:
        """The current round's upstream body ended."""
        if self._state == "done":
            return []
        if self._round.terminal_name is None:
            return self._fail(
                "follow_up_failed" if self._round.number else "principal_missing_terminal",
                "upstream Responses stream ended without a terminal event",
            )
        return self._end_round()

    def _feed(self, event: SSEEvent) -> list[Action]:
        self._stream_bytes += len(event.raw)
        if self._stream_bytes > self._limits.stream_bytes:
            raise ProtocolError("Responses stream exceeded byte limit")
        if self._round.terminal_name is not None:
            return []  # bytes after the terminal are discarded (D.4)
        if event.event in _TEXT_DELTAS and self._deltas_pass():
            return self._pass_delta(event)
        if not event.has_data:
            return self._pass_through(event)
        data = event.data.strip()
        if not data or data == "[DONE]":
            return []
        name = event.name
        try:
            payload = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            if name.startswith("response."):
                raise ProtocolError(f"malformed JSON in Responses event {name}") from None
            if name == RATE_LIMITS or name == "message":
                return []
            return self._pass_through(event)
        if not isinstance(payload, dict):
            raise ProtocolError(f"malformed JSON in Responses event {name}")
        kind = payload.get("type")
        if event.event is not None and kind is not None and kind != name:
            raise ProtocolError(f"Responses payload type does not match {name}")
        if event.event is None and isinstance(kind, str):
            name = kind
        if name == RATE_LIMITS:
            return self._rate_limits(event, payload)
        if self._round.fresh_ids is not None:
            event, payload = self._round.fresh_ids.event(event, name, payload)
        if not name.startswith("response."):
            return self._pass_through(event)
        if name in ("response.created", "response.in_progress", "response.queued"):
            return self._lifecycle(event, name, payload)
        if name in TERMINALS:
            return self._terminal(event, name, payload)
        return self._item_event(event, name, payload)

    # --- lifecycle ----------------------------------------------------------------

    def _lifecycle(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> list[Action]:
        response = payload.get("response")
        if not isinstance(response, dict):
            raise ProtocolError(f"malformed Responses event {name}")
        if self._round.number > 0:
            return []  # a continuation's own created/in_progress never reach the client
        if name == "response.created":
            if self._created_sent:
                raise ProtocolError("duplicate response.created")
            self.response_id = response.get("id")
            self._created_at = response.get("created_at")
            self._model = response.get("model")
            self._created_sent = True
            out: list[Action] = [Send(self._reframe(event, name, payload))]
            out.extend(Send(raw) for raw in self._pre_created)
            self._pre_created.clear()
            return out
        if not self._created_sent:
            raise ProtocolError(f"Responses event before response.created: {name}")
        return self._emit_or_defer(event, name, payload)

    def _rate_limits(self, event: SSEEvent, payload: dict[str, Any]) -> list[Action]:
        sanitised = sanitize_rate_limits(payload)
        self.rate_limits.append(payload)
        if sanitised is None:
            return []
        # The sanitised copy is what the gateway keeps; the client gets the frame
        # byte-identical (the recorded-stream acceptance) once it passed the check.
        raw = event.raw
        if not self._created_sent:
            if len(self._pre_created) < 64:
                self._pre_created.append(raw)
            return []
        return [Send(raw)]

    # --- end of a round -----------------------------------------------------------

    def _terminal(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> list[Action]:
        rnd = self._round
        response = payload.get("response")
        if not isinstance(response, dict):
            raise ProtocolError(f"malformed Responses terminal event {name}")
        rnd.terminal_name = name
        rnd.terminal = payload
        if response.get("usage") is not None:
            self._usage = merge_usage(self._usage, usage_from_responses(response["usage"]))
        if rnd.number == 0 and not rnd.recalls():
            # No recall happened: forward verbatim, nothing to rebuild.
            visible = sum(1 for i in rnd.items.values() if i.kind == "function_call")
            action = self._machine.round(Round(0, visible, usable=True, relayed=True))
            assert isinstance(action, Deliver)
            self._state = "done"
            self._terminal_sent = True
            self._relaying = True
            failed = name == "response.failed" or response.get("status") in ("failed", "cancelled")
            return [
                *[Send(b) for b in self._flush_deferred()],
                Send(self._reframe(event, name, payload)),
                Done(ok=not failed),
            ]
        return []

    # --- results for the shell ----------------------------------------------------

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def delivered_response(self) -> dict[str, Any] | None:
        """The response as the client received it (visible items, last status,
        merged usage), or None when it got a failure instead."""
        if self.failure is not None or not self._terminal_sent:
            return None
        last = next((r for r in reversed(self._rounds) if r.terminal is not None), None)
        if last is None or last.terminal is None:
            return None
        response = dict(last.terminal["response"])
        if last.number > 0 or not response.get("output"):
            # A forwarded terminal's own output is what an SDK client reads.
            response["output"] = self._visible_output()
        response["model"] = response.get("model") or self._model
        if self._usage is not None:
            response["usage"] = usage_to_responses(self._usage)
        return response

    def turn_items(self) -> list[dict[str, Any]]:
        """Everything the model produced this turn, in order, recall calls and
        their results included (what storage writes)."""
        out: list[dict[str, Any]] = []
        recall_pairs = iter(_pairs(self._extra_items + self._stored_outputs))
        for rnd in self._rounds:
            for item in sorted(rnd.items.values(), key=lambda i: i.index):
                out.append(item.snapshot())
                if item.recall:
                    out.extend(next(recall_pairs, []))
        return out


def _pairs(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The ``function_call_output`` of each recall, in order (its call is already in
    the round's items)."""
    return [[i] for i in items if i.get("type") == "function_call_output"]
