"""What a Responses client sees of a recall-watched stream: the emission layer of
:class:`~lore_gateway.recall.responses.live.LiveInterceptor` (sans-IO).

It owns the client's numbering and the bytes held back: ``sequence_number`` kept
contiguous, ``output_index`` renumbered to visible positions once something was
hidden, events deferred while a recall is open (bounded), the continuation
spooled until the chain ends (bounded), and the synthetic frames (the anchor
item, the rebuilt terminal, ``response.failed``). The interceptor above it
decides *what* is hidden or held; this layer turns that into client bytes.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.usage import Usage, usage_to_responses
from lore_gateway.recall.core.chain import RecallFailed
from lore_gateway.recall.responses.frames import failed_event, marker_events, marker_item
from lore_gateway.recall.responses.round import Action, Limits, RoundState, Send
from lore_gateway.sse import SSEEvent, encode_event


class ClientEmission:
    """Client numbering, deferral and spooling for one streamed response."""

    # Set by the interceptor (the round being fed, and what the principal said).
    _round: RoundState
    _rounds: list[RoundState]
    _created_sent: bool
    _stored_outputs: list[dict[str, Any]]
    _usage: Usage | None
    response_id: str | None
    _created_at: Any
    _model: Any

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._seq = 0
        # Upstream sequence numbers and output indices are forwarded as sent until
        # an event is hidden; from then on the client's are renumbered densely.
        self._renumber = False
        self._public: dict[tuple[int, int], int] = {}
        self._next_public = 0
        self._visible: dict[int, dict[str, Any]] = {}
        self._deferred: list[tuple[int, SSEEvent]] = []
        self._deferred_bytes = 0
        self._spool: list[bytes] = []
        self._spool_bytes = 0

    def _deltas_pass(self) -> bool:
        """Whether a text delta may go out after a cheap check only.

        Most of a stream is text deltas, and applying each one to the item state
        is most of the cost of watching a stream for recall. A text delta cannot
        reveal a recall, and its text repeats in the ``*.done`` events, which are
        applied. So while the principal has hidden and held nothing (numbering is
        still the upstream's), a delta is checked (valid JSON of its type) and
        forwarded byte for byte.
        """
        return (
            self._round.number == 0
            and self._created_sent
            and not self._renumber
            and not self._deferred
            and self._round.fresh_ids is None
            and not self._round.open_hold()
        )

    def _pass_delta(self, event: SSEEvent) -> list[Action]:
        seq = self._checked_delta(event)
        if seq is False:
            raise ProtocolError(_delta_failure(event))
        if seq is not None:
            self._seq = seq + 1
        return [Send(event.raw)]

    @staticmethod
    def _checked_delta(event: SSEEvent) -> int | Literal[False] | None:
        """The cheap check of a text delta forwarded untouched: its sequence number
        (``None`` without one), or ``False`` when it is malformed or its payload's
        type is not its event's (``_delta_failure`` then says which). Only events
        named as a text delta come here, so ``event.event`` is their name."""
        try:
            payload = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(payload, dict):
            return False
        kind = payload.get("type")
        if kind is not None and kind != event.event:
            return False
        seq = payload.get("sequence_number")
        return seq if isinstance(seq, int) else None

    def _emit_or_defer(self, event: SSEEvent, name: str, payload: dict[str, Any]) -> list[Action]:
        if self._holding():
            self._hold(event)
            return []
        # A Codex call whose name turned out visible releases what it held, in order.
        held = [Send(b) for b in self._flush_deferred()] if self._deferred else []
        return [*held, Send(self._reframe(event, name, payload))]

    def _holding(self) -> bool:
        """Continuations are spooled whole; a principal defers once a recall (or a
        Codex call whose name is not yet known) has appeared."""
        return self._round.number > 0 or self._round.open_hold()

    def _hold(self, event: SSEEvent) -> None:
        if self._round.number > 0:
            self._retain(len(event.raw))
        else:
            self._charge_deferred(len(event.raw))
        self._deferred.append((self._round.number, event))

    def _visible_key(self, rnd: int, index: int) -> int:
        key = (rnd, index)
        public = self._public.get(key)
        if public is None:
            # Until something is hidden the client sees the upstream's own indices,
            # gaps included; after that, visible items are numbered densely.
            public = index if rnd == 0 and not self._renumber else self._next_public
            self._public[key] = public
            self._next_public = max(self._next_public, public + 1)
        return public

    def _pass_through(self, event: SSEEvent) -> list[Action]:
        if self._holding():
            self._hold(event)
            return []
        held = [Send(b) for b in self._flush_deferred()] if self._deferred else []
        return [*held, Send(event.raw)]

    def _reframe(
        self, event: SSEEvent, name: str, payload: dict[str, Any], rnd: int | None = None
    ) -> bytes:
        """The event as the client must see it: contiguous sequence numbers, public
        output indices, the principal's response id. Unchanged events keep their
        exact bytes."""
        changed = False
        number = self._round.number if rnd is None else rnd
        if "sequence_number" in payload:
            seq = payload["sequence_number"]
            if self._renumber or number > 0 or not isinstance(seq, int) or seq < self._seq:
                if seq != self._seq:
                    payload = {**payload, "sequence_number": self._seq}
                    changed = True
                self._seq += 1
            else:
                self._seq = seq + 1
        index = payload.get("output_index")
        if isinstance(index, int):
            public = self._visible_key(number, index)
            if public != index:
                payload = {**payload, "output_index": public}
                changed = True
        response = payload.get("response")
        if (
            number > 0
            and isinstance(response, dict)
            and self.response_id
            and response.get("id") != self.response_id
        ):
            payload = {**payload, "response": {**response, "id": self.response_id}}
            changed = True
        if not changed and event.event == name:
            return event.raw
        return encode_event(name, orjson.dumps(payload))

    def _charge_deferred(self, size: int) -> None:
        self._deferred_bytes += size
        if self._deferred_bytes > self._limits.deferred_bytes:
            raise ProtocolError("recall stream exceeded deferred event limit")

    def _retain(self, size: int) -> None:
        self._spool_bytes += size
        if self._spool_bytes > self._limits.retained_bytes:
            message = "Responses retained state exceeded byte limit"
            if self._round.number > 0:
                # The spooled continuation outgrew its bound: a resource limit, which
                # a recovery request (spooled the same way) would only hit again.
                raise RecallFailed("resource_limit", message)
            raise ProtocolError(message)

    def _flush_deferred(self) -> list[bytes]:
        out: list[bytes] = []
        for rnd, ev in self._deferred:
            try:
                payload = orjson.loads(ev.data) if ev.has_data else None
            except orjson.JSONDecodeError:
                payload = None
            if not isinstance(payload, dict):
                out.append(ev.raw)
                continue
            name = ev.event or str(payload.get("type") or ev.name)
            out.append(self._reframe(ev, name, payload, rnd))
        self._deferred.clear()
        self._deferred_bytes = 0
        return out

    def _drop_deferred_of(self, index: int) -> None:
        kept: list[tuple[int, SSEEvent]] = []
        for rnd, ev in self._deferred:
            try:
                payload = orjson.loads(ev.data)
            except orjson.JSONDecodeError:
                payload = None
            if (
                rnd == self._round.number
                and isinstance(payload, dict)
                and (payload.get("output_index") == index)
            ):
                self._charge_deferred(len(ev.raw))
                self._renumber = True
                continue
            kept.append((rnd, ev))
        self._deferred = kept

    def _marker_item(self, anchor_id: str) -> list[bytes]:
        public = self._next_public
        self._next_public += 1
        item = marker_item(self.response_id, public, anchor_id)
        self._visible[public] = item
        self._stored_outputs.append(item)
        frames = marker_events(item, public, self._seq)
        self._seq += len(frames)
        return frames

    def _rebuilt_terminal(self, name: str, payload: dict[str, Any]) -> bytes:
        """The last round's terminal, carrying the principal's id and creation time,
        every visible item in public order, and the usage of all rounds."""
        response = dict(payload["response"])
        response["id"] = self.response_id or response.get("id")
        if self._created_at is not None:
            response["created_at"] = self._created_at
        response["output"] = self._visible_output()
        if self._usage is not None:
            response["usage"] = usage_to_responses(self._usage)
        rebuilt = {**payload, "response": response}
        if "sequence_number" in rebuilt:
            rebuilt["sequence_number"] = self._seq
            self._seq += 1
        return encode_event(name, orjson.dumps(rebuilt))

    def _visible_output(self) -> list[dict[str, Any]]:
        out: dict[int, dict[str, Any]] = dict(self._visible)
        for rnd in self._rounds:
            for item in rnd.items.values():
                key = (rnd.number, item.index)
                if not item.recall and key in self._public:
                    out[self._public[key]] = item.snapshot()
        return [out[k] for k in sorted(out)]

    def _failed_frame(self, message: str) -> bytes:
        frame = failed_event(
            response_id=self.response_id,
            created_at=self._created_at,
            model=self._model,
            message=message,
            seq=self._seq,
        )
        self._seq += 1
        return frame


def _delta_failure(event: SSEEvent) -> str:
    """Why ``_checked_delta`` refused ``event``: built only on that failure."""
    try:
        payload = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        return f"malformed JSON in Responses event {event.name}"
    return f"Responses payload type does not match {event.name}"
