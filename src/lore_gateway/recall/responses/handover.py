"""The interceptor's side of an :class:`~.gate.UntouchedGate` (sans-IO): when
the shell may relay reads without feeding them (:attr:`Handover.transparent`),
the gate it gets (:meth:`Handover.untouched_gate`), and taking the stream over
from the gate (:meth:`Handover.catch_up`). A layer of
:class:`~.live.LiveInterceptor`, as :class:`~.items.ItemTracking` and
:class:`~.emission.ClientEmission` are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.core.chain import FailureCategory, RecallFailed
from lore_gateway.recall.responses.gate import Relayed, UntouchedGate
from lore_gateway.recall.responses.items import ItemTracking
from lore_gateway.recall.responses.round import Action, Done
from lore_gateway.sse import SSEEvent


class Handover(ItemTracking):
    """Reads relayed untouched, and the interceptor catching up on them."""

    # Set by the interceptor.
    _state: str
    _relaying: bool
    _pre_created: list[bytes]
    _stream_bytes: int

    if TYPE_CHECKING:
        def _terminal(self, event: SSEEvent, name: str,
                      payload: dict[str, Any]) -> list[Action]: ...

        def _fail(self, category: FailureCategory,
                  message: str | None = None) -> list[Action]: ...

    @property
    def transparent(self) -> bool:
        """Whether the principal so far went out as it came, with nothing hidden,
        held or renumbered and its ``response.created`` sent: until a function
        call appears, every frame would leave unchanged, so the shell may relay
        reads an :class:`~.gate.UntouchedGate` vouches for without feeding them
        here, and hand them over with :meth:`catch_up` when it must."""
        return (self._state == "streaming" and not self._relaying and not self._pre_created
                and self._round.terminal_name is None and self._deltas_pass())

    def untouched_gate(self, *, frames: int = 0, tail: bytes = b"") -> UntouchedGate:
        """A gate for the reads after this point (only while :attr:`transparent`),
        which never lets so much through that this interceptor's stream or
        retained limits could trip on catching up. ``frames``: those the
        stream's decoder already counted; ``tail``: the start of a frame it had
        not finished."""
        assert self.transparent, "the gate is only for a transparent principal"
        limits = self._limits
        budget = min(limits.stream_bytes,
                     self._stream_bytes + limits.retained_bytes - self._spool_bytes)
        done = sum(1 for item in self._round.items.values() if item.state.done)
        return UntouchedGate(next_seq=self._seq, stream_bytes=self._stream_bytes,
                             budget=budget, items_done=done, frames=frames, tail=tail)

    def catch_up(self, relayed: Relayed) -> list[Action]:
        """Take over from a gate: apply the item events it let through (their
        frames went out unchanged, as they would have from here) and go on
        numbering after everything it let through. Returns what the client still
        needs: the failure an item event gets when its bookkeeping fails
        (numbered after the frames the client already has), or nothing.

        After a terminal the gate let through, only the terminal is applied:
        the answer is whole, the client has it, and its output (which the gate
        made sure it carries) is what the turn's items are read from
        (``recall/responses/stored.py``). Then the result is ``Done``."""
        if relayed.terminal is not None:
            event, payload = relayed.terminal
            # Numbered from before the gate, the terminal keeps its own number (it
            # went out as it came): nothing to re-encode.
            done: list[Action] = [
                a for a in self._terminal(event, event.name, payload) if isinstance(a, Done)]
            self._resume(relayed)
            return done
        try:
            for name, data in relayed.items:
                self._replay_item(name, orjson.loads(data))
        except RecallFailed as exc:
            self._resume(relayed)
            return self._fail(exc.category, str(exc))
        except ProtocolError as exc:
            self._resume(relayed)
            return self._fail("principal_protocol", str(exc))
        self._resume(relayed)
        return []

    def _resume(self, relayed: Relayed) -> None:
        self._seq = max(self._seq, relayed.next_seq)
        self._stream_bytes = relayed.stream_bytes

    def _replay_item(self, name: str, payload: dict[str, Any]) -> None:
        """Apply an item event that already went out unchanged (``catch_up``):
        its item state, and its output index as the client saw it."""
        self._apply(name, payload)
        index = payload.get("output_index")
        if isinstance(index, int):
            self._visible_key(self._round.number, index)
