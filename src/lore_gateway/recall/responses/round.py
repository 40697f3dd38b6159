"""What the sans-IO :class:`~lore_gateway.recall.responses.live.LiveInterceptor`
returns, its limits (lore-spec E.1), and the state of its rounds.

Its actions are the client's bytes (:class:`Send`), the end of the stream
(:class:`Done`) and the core chain machine's own ``RunRecall`` and ``FollowUp``
(``recall/core/machine.py``), filled in with the call and the follow-up's items:
the chain's steps are the machine's, not this package's.

Every upstream item event, forwarded, deferred or hidden alike (lore-spec D.3),
is applied to the round's
:class:`~lore_gateway.protocols.responses_stream.ResponsesAccumulator`, the same
item state storage builds; a :class:`RoundItem` adds only whether the item is
hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from lore_gateway.protocols.responses_model import Item
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.recall.core.chain import FailureCategory
from lore_gateway.recall.core.machine import FollowUp, RunRecall
from lore_gateway.recall.core.tool import is_recall_call
from lore_gateway.recall.responses.recovery import FreshIds

MiB = 1024 * 1024
# E.1 defaults. A real answer is a few hundred KiB; 64 MiB bounds a runaway stream.
MAX_STREAM_BYTES = 64 * MiB
# Item snapshots and the continuation spool kept until the chain ends.
MAX_RETAINED_BYTES = 16 * MiB
# Events held back (and hidden recall events) while a recall is open.
MAX_DEFERRED_BYTES = 1 * MiB

RECALL_FAILED_MESSAGE = "Lore could not continue the response after recall"
GATEWAY_FAILED_MESSAGE = "Gateway request failed"
RATE_LIMITS = "codex.rate_limits"
TERMINALS = ("response.completed", "response.incomplete", "response.failed", "response.done")


class Limits(msgspec.Struct, frozen=True):
    stream_bytes: int = MAX_STREAM_BYTES
    retained_bytes: int = MAX_RETAINED_BYTES
    deferred_bytes: int = MAX_DEFERRED_BYTES


# --- actions --------------------------------------------------------------------------
# Frozen msgspec Structs, as the core machine's (recall/core/machine.py says why).


class Send(msgspec.Struct, frozen=True):
    """Bytes for the client, now."""

    data: bytes


class Done(msgspec.Struct, frozen=True):
    """The client has the stream's end: ``ok`` commits the staged recalls, else
    they are rolled back (``category``: the chain's failure, if it failed)."""

    ok: bool
    category: FailureCategory | None = None


Action = Send | RunRecall | FollowUp | Done


# --- per-round state ------------------------------------------------------------------


def _codex_accumulator() -> ResponsesAccumulator:
    # Lenient mode for every upstream: the interceptor has never held a public
    # stream to the strict lifecycle checks, and storage validates it separately.
    return ResponsesAccumulator("codex")


@dataclass(slots=True)
class RoundItem:
    """The interceptor's view of one item of its round's accumulator: only what
    is the interceptor's own (is it a recall, or a Codex call whose name is
    still unknown and must be held). The item state itself is ``state``."""

    state: Item
    acc: ResponsesAccumulator
    recall: bool = False
    unresolved: bool = False

    @property
    def index(self) -> int:
        return self.state.index

    @property
    def kind(self) -> str:
        return self.state.type

    def snapshot(self) -> dict[str, Any]:
        """The item as stored and sent in a follow-up."""
        return self.acc.snapshot(self.state)

    def classify(self, codex: bool) -> None:
        """Mark a function call as recall, or (Codex) as unresolved while its name
        is still unknown."""
        if self.kind != "function_call":
            return
        name = self.state.name
        self.recall = is_recall_call(name)
        self.unresolved = not self.recall and not name and codex

    def reclassify(self, codex: bool) -> bool:
        """Classify again after an ``output_item`` event. True when an unresolved
        call turned out to be a recall (its deferred events must be dropped, not
        released). A call still nameless when done is visible."""
        was_unresolved = self.unresolved
        self.classify(codex)
        if self.state.done:
            self.unresolved = False
        return self.recall and was_unresolved


@dataclass(slots=True)
class RoundState:
    """One upstream answer of the chain (the principal, a continuation or the
    recovery) as the interceptor tracks it: its items and its terminal."""

    number: int
    recovery: bool = False
    acc: ResponsesAccumulator = field(default_factory=_codex_accumulator)
    items: dict[int, RoundItem] = field(default_factory=dict)
    terminal_name: str | None = None
    terminal: dict[str, Any] | None = None
    fresh_ids: FreshIds | None = None  # a recovery answer gets gateway-made ids
    # Whether a recall or an unresolved call is open: asked on every text delta
    # (the fast path), so kept current by :meth:`classified` instead of recomputed.
    holding: bool = False

    def recalls(self) -> list[RoundItem]:
        return [i for i in self.items.values() if i.recall]

    def open_hold(self) -> bool:
        return self.holding

    def classified(self) -> None:
        """An item was added or classified again: recompute :attr:`holding`."""
        self.holding = any(i.recall or i.unresolved for i in self.items.values())
