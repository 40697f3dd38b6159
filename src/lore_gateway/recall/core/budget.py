"""How much recalling one client request may do (lore-spec B.7).

A model can chain recalls: search, fetch a detail, search again. Each link costs an
upstream round trip and grows the prompt, so one :class:`RecallChainBudget` per
client request bounds the chain by executions, result bytes, distinct source items,
wall-clock time, and progress (recalls that add nothing new). When a bound is
reached the *next* follow-up is the final round: its tool result tells the model
the budget is used, and a recall in its answer is a failure (``depth_exhausted``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from lore_gateway.recall.core.tool import RecallArgs

StopReason = Literal["time", "tokens", "result_bytes", "items", "stalled", "execution"]

# The reference allows 24 links; its own tests treat 12 as the floor a useful chain
# needs (search, a few details, a refined search, ...).
DEFAULT_MAX_EXECUTIONS = 24
MIN_MAX_EXECUTIONS = 12
# Results are pasted into the prompt; 512 KiB is ~130k tokens, the whole
# additional-token allowance of the reference.
MAX_RESULT_BYTES = 512 * 1024
# Distinct source items a chain may touch, and what each kind of call reserves at
# admission (a search may return up to 30 hits; its reservation is replaced by the
# delivered count afterwards).
MAX_ITEMS = 64
SEARCH_RESERVATION = 30
# More than two recalls in a row that add no new coverage: the model is looping.
MAX_NO_PROGRESS = 2
# The foreground request deadline, minus time kept back to write the final answer.
DEFAULT_DEADLINE_SECONDS = 300.0
FINALIZATION_RESERVE_SECONDS = 20.0

FINAL_ROUND_TEXT = (
    "The recall budget for this turn has been used. Continue the user's task using the "
    "results already available. Give your best supported answer, state any remaining "
    "uncertainty, or use an available non-recall tool. Do not request recall again."
)


def stop_note(reason: StopReason) -> str:
    """Appended to the last result when a bound (not the final round itself) stopped
    the chain."""
    return (
        f"\n\n[Recall policy: stop further recall because {reason}. Use the evidence above "
        "to answer now or hand back an ordinary tool.]"
    )


@dataclass(frozen=True, slots=True)
class Coverage:
    """One source item a recall returned. Private: it feeds the budget and the
    diagnostics and is never rendered for the model or sent to the client.

    ``identity`` is the canonical source id (aliases resolve to the same one);
    ``revision`` fingerprints its content, so a preview and a detail of the same
    revision count as one item.
    """

    identity: str
    revision: str
    score: float | None = None
    kind: Literal["preview", "detail"] = "preview"


def _reservation(args: RecallArgs) -> int:
    if args.ids is not None:
        return min(len(args.ids), 8)
    if args.id is not None:
        return 1
    return SEARCH_RESERVATION


class RecallChainBudget:
    """One per client request. ``admit`` before a recall runs, ``record`` after."""

    def __init__(
        self,
        *,
        max_executions: int = DEFAULT_MAX_EXECUTIONS,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_items: int = MAX_ITEMS,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_executions < MIN_MAX_EXECUTIONS:
            raise ValueError(
                f"recall chain max_executions is {max_executions}; it must be at least "
                f"{MIN_MAX_EXECUTIONS} so a search-then-detail chain can finish"
            )
        self.max_executions = max_executions
        self.max_result_bytes = max_result_bytes
        self.max_items = max_items
        self._clock = clock
        self._deadline = clock() + max(0.0, deadline_seconds - FINALIZATION_RESERVE_SECONDS)
        self.executions = 0
        self.result_bytes = 0
        self._seen: set[tuple[str, str]] = set()
        self._no_progress = 0
        self.stop_reason: StopReason | None = None
        self._final_round = False

    @property
    def items(self) -> int:
        return len({identity for identity, _ in self._seen})

    @property
    def final_round(self) -> bool:
        """True once the follow-up being prepared is the last one allowed."""
        return self._final_round

    def admit(self, args: RecallArgs) -> StopReason | None:
        """Reserve room for one recall; return why it is refused, or None.

        A refusal ends the chain: the caller fails the round ``depth_exhausted``.
        """
        if self._final_round:
            return self.stop_reason or "execution"
        if self.executions >= self.max_executions:
            return "execution"
        if self._clock() >= self._deadline:
            return "time"
        if self.result_bytes >= self.max_result_bytes:
            return "result_bytes"
        if self.items + _reservation(args) > self.max_items:
            return "items"
        self.executions += 1
        return None

    def record(self, result_text: str, coverage: Iterable[Coverage]) -> None:
        """Account a finished recall and decide whether the next round is final."""
        self.result_bytes += len(result_text.encode("utf-8"))
        before = len(self._seen)
        self._seen.update((c.identity, c.revision) for c in coverage)
        self._no_progress = self._no_progress + 1 if len(self._seen) == before else 0
        reason: StopReason | None = None
        if self.executions >= self.max_executions:
            reason = "execution"
        elif self.result_bytes >= self.max_result_bytes:
            reason = "result_bytes"
        elif self.items >= self.max_items:
            reason = "items"
        elif self._no_progress > MAX_NO_PROGRESS:
            reason = "stalled"
        elif self._clock() >= self._deadline:
            reason = "time"
        if reason is not None:
            self.stop_reason = reason
            self._final_round = True

    def result_for_model(self, result_text: str) -> str:
        """The tool result as sent upstream: the recall's text, plus the final-round
        instruction (and the stop note) when this is the last follow-up."""
        text = result_text or "[No results found.]"
        if not self._final_round:
            return text
        note = stop_note(self.stop_reason) if self.stop_reason is not None else ""
        return f"{text}{note}\n\n{FINAL_ROUND_TEXT}"

    def can_recover(self) -> bool:
        """Whether one recovery request ("answer without recall") still fits in time."""
        return self._clock() < self._deadline + FINALIZATION_RESERVE_SECONDS
