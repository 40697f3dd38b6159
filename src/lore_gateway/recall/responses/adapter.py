"""The live Responses stream as an adapter of the core chain machine (sans-IO).

The policy (which step comes next, when a failure is recovered) is
:class:`~lore_gateway.recall.core.machine.ChainMachine`'s, as on every other
path. This layer of :class:`~.live.LiveInterceptor` summarises each ended round
for it (:meth:`ChainAdapter._summary`) and carries its answer out on the
stream (:meth:`ChainAdapter._act`):

``RunRecall``  admit the call (a broken frame or a refused call goes back to
               the machine: ``recall_refused``) and hand it to the shell filled in
``FollowUp``   hand the shell the follow-up's items; a recovery first drops what
               the failed continuation produced (it never reached the client)
``Deliver``    release what was held back: the spooled continuation, the
               deferred events and one rebuilt terminal (the adapter's hook)
``Fail``       one ``response.failed``

What the Responses stream keeps of its own is summarised into the machine's
inputs: a ``response.incomplete`` continuation is delivered as it is, an
unusable one fails ``follow_up_missing_output``, a recovery answer that repeats
what the client has is a follow-up that failed (lore-spec C.1, C.5, C.7).
"""

from __future__ import annotations

from typing import Any, Literal

from lore_gateway.protocols.usage import Usage
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import UPSTREAM_FAILURES, FailureCategory, with_reason
from lore_gateway.recall.core.machine import (
    ChainAction,
    ChainMachine,
    ChainState,
    Deliver,
    Fail,
    FollowUp,
    Round,
    RunRecall,
)
from lore_gateway.recall.core.tool import (
    RecallArgs,
    RecallArgumentError,
    RecallFrameError,
    decode_arguments,
    parse_arguments,
)
from lore_gateway.recall.responses.handover import Handover
from lore_gateway.recall.responses.recovery import FreshIds, repeated_delivery
from lore_gateway.recall.responses.round import (
    GATEWAY_FAILED_MESSAGE,
    RECALL_FAILED_MESSAGE,
    Action,
    Done,
    Limits,
    RoundItem,
    RoundState,
    Send,
)


class ChainAdapter(Handover):
    """The rounds of one live Responses stream, on the chain machine."""

    def __init__(self, limits: Limits, budget: RecallChainBudget) -> None:
        super().__init__(limits)
        self._budget = budget
        self._machine = ChainMachine(budget)
        self._round = RoundState(0)
        self._rounds: list[RoundState] = [self._round]
        self._state: Literal["streaming", "recall", "follow_up", "done"] = "streaming"
        self._terminal_sent = False
        self._usage: Usage | None = None
        self._extra_items: list[dict[str, Any]] = []  # what the follow-up appends
        self._stored_outputs: list[dict[str, Any]] = []
        self.depth = 0  # recalls that searched (an invalid call answered is none)
        self.recall_ran = False
        self.pending: RunRecall | None = None

    @property
    def failure(self) -> tuple[FailureCategory, str | None] | None:
        """(category, exact reason) of the chain's failure, for diagnostics; never sent."""
        failure = self._machine.failure
        return None if failure is None else (failure.category, failure.reason or None)

    @property
    def recovered_from(self) -> tuple[FailureCategory, str] | None:
        """The same for a continuation failure that recovery then answered."""
        return self._machine.recovered_from

    # --- the machine's inputs ---------------------------------------------------------

    def _summary(self, rnd: RoundState) -> Round:
        """The ended round as the machine reads it."""
        assert rnd.terminal is not None
        status = rnd.terminal["response"].get("status")
        failed = rnd.terminal_name == "response.failed" or status in ("failed", "cancelled")
        incomplete = rnd.terminal_name == "response.incomplete" or status == "incomplete"
        recalls = len(rnd.recalls())
        visible = sum(1 for i in rnd.items.values() if i.kind == "function_call" and not i.recall)
        # A cut continuation is what the client gets: it counts as usable here.
        usable = self._usable(rnd) or (incomplete and not recalls)
        reason = ""
        if recalls and failed:
            reason = "recall principal returned response.failed"
        elif recalls and incomplete:
            reason = "incomplete recall principal cannot execute recall"
        elif failed:
            reason = "recall continuation failed"
        return Round(recalls, visible, usable, complete=not reason, reason=reason,
                     missing_output="follow_up_missing_output")

    @staticmethod
    def _usable(rnd: RoundState) -> bool:
        """C.1 "usable continuation": text, a refusal or a visible tool call."""
        for item in rnd.items.values():
            if item.kind == "function_call" and not item.recall:
                return True
            if item.kind == "message":
                for part in item.snapshot().get("content") or []:
                    if isinstance(part, dict) and (
                        part.get("type") == "refusal" or str(part.get("text") or "").strip()
                    ):
                        return True
        return False

    def _repeat(self, rnd: RoundState) -> str | None:
        """Why a recovery answer would repeat what the client already has."""
        earlier = [i.snapshot() for r in self._rounds if r is not rnd
                   for i in r.items.values() if not i.recall]
        return repeated_delivery([i.snapshot() for i in rnd.items.values()], earlier)

    def _end_round(self) -> list[Action]:
        """The current round's body ended after its terminal."""
        rnd = self._round
        if rnd.number == 0 and not rnd.recalls():
            return []  # the machine delivered it at the terminal
        summary = self._summary(rnd)
        if rnd.recovery and summary.complete and summary.usable and not summary.recalls:
            repeat = self._repeat(rnd)
            if repeat is not None:
                # The recovery answer cannot be used: a follow-up that failed.
                return self._act(self._machine.follow_up_failed("follow_up_failed", repeat))
        return self._act(self._machine.round(summary))

    def _fail(self, category: FailureCategory, message: str | None = None) -> list[Action]:
        """A failure of the stream itself (a broken frame, a limit, the transport)."""
        if self._terminal_sent:
            self._state = "done"
            return [Done(ok=False, category=category)]
        machine = self._machine
        if machine.state is ChainState.AWAIT_ANSWER:
            return self._act(machine.follow_up_failed(category, message or ""))
        return self._act(machine.fail(category, message or ""))

    def follow_up_failed(
        self, category: FailureCategory, reason: str | None = None
    ) -> list[Action]:
        """The follow-up could not be sent or read; the machine decides whether
        one recovery is tried."""
        return self._fail(category, reason)

    # --- the machine's answers ----------------------------------------------------------

    def _act(self, action: ChainAction) -> list[Action]:
        if isinstance(action, RunRecall):
            return self._start_recall()
        if isinstance(action, FollowUp):
            return self._follow_up(recovery=action.recovery)
        if isinstance(action, Deliver):
            return self._deliver(self._round)
        return self._failed(action)

    def _start_recall(self) -> list[Action]:
        """Admit the round's recall; the shell runs it and calls :meth:`recall_done`."""
        snapshot = self._round.recalls()[0].snapshot()
        arguments = snapshot.get("arguments") or ""
        args: RecallArgs | None = None
        invalid: RecallArgumentError | None = None
        try:
            args = parse_arguments(decode_arguments(arguments))
        except RecallFrameError as exc:
            return self._act(self._machine.recall_refused("follow_up_protocol", str(exc)))
        except RecallArgumentError as exc:
            invalid = exc
            if self._machine.visible_tools:
                return self._act(self._machine.recall_refused(
                    "recall_execution", "invalid call alongside a visible tool"))
        if args is not None:
            refusal = self._budget.admit(args)
            if refusal is not None:
                return self._act(self._machine.recall_refused(
                    "depth_exhausted", f"recall budget exhausted: {refusal}"))
        self._state = "recall"
        self.pending = RunRecall(
            call_id=str(snapshot.get("call_id") or snapshot.get("id") or ""),
            arguments=str(arguments),
            args=args,
            invalid=invalid,
        )
        return [self.pending]

    def recall_done(self, result_text: str, anchor_id: str | None) -> list[Action]:
        """The shell ran the pending recall. ``result_text`` is the raw tool result
        (before budget notes); ``anchor_id`` names the staged store entry, None for
        an invalid call (no marker then)."""
        pending = self.pending
        assert pending is not None and self._state == "recall", "no recall is pending"
        self.pending = None
        rnd = self._round
        recall = next(i for i in rnd.items.values() if i.recall)
        if pending.invalid is not None:
            tool_result = pending.invalid.tool_result()
        else:
            self.depth += 1
            self.recall_ran = True
            tool_result = self._budget.result_for_model(result_text)
        call = {
            "type": "function_call",
            "call_id": pending.call_id,
            "name": recall.state.name or "recall",
            "arguments": pending.arguments,
        }
        output = {"type": "function_call_output", "call_id": pending.call_id, "output": tool_result}
        marker = self._marker_item(anchor_id) if anchor_id is not None else []
        action = self._machine.recall_ran(opens_recovery=pending.invalid is None)
        if isinstance(action, Deliver):
            # Mixed: no follow-up; the client runs its tool, the recall is replayed
            # from the store on the next request.
            # Earlier rounds' markers were spooled until the chain ended; it ends here.
            self._stored_outputs.extend([call, output])
            self._spool.extend(marker)
            return self._deliver(rnd)
        self._extra_items.extend(_visible_items(rnd))
        self._extra_items.extend([call, output])
        self._spool.extend(marker)
        self._spool.extend(self._flush_deferred())
        return self._act(action)

    def _follow_up(self, *, recovery: bool) -> list[Action]:
        if recovery:
            # Drop what the failed continuation produced; it never reached the client.
            if self._round.number > 0 and self._round is self._rounds[-1]:
                self._rounds.pop()
                self._round = self._rounds[-1]
            self._deferred = [(r, e) for r, e in self._deferred if r < len(self._rounds)]
        self._state = "follow_up"
        return [FollowUp(recovery=recovery, items=tuple(self._extra_items))]

    def begin_continuation(self, *, recovery: bool = False) -> None:
        """The follow-up (or recovery) stream is about to be fed."""
        self._round = RoundState(len(self._rounds), recovery=recovery,
                                 fresh_ids=FreshIds() if recovery else None)
        self._rounds.append(self._round)
        self._state = "streaming"

    def _deliver(self, rnd: RoundState) -> list[Action]:
        """The chain succeeded: the held-back events, then the rebuilt terminal."""
        frames = [*self._spool, *self._flush_deferred()]
        self._spool.clear()
        return [*(Send(f) for f in frames), *self._finish(rnd)]

    def _finish(self, rnd: RoundState) -> list[Action]:
        assert rnd.terminal is not None and rnd.terminal_name is not None
        self._state = "done"
        self._terminal_sent = True
        status = rnd.terminal["response"].get("status")
        ok = rnd.terminal_name in ("response.completed", "response.done") and status in (
            None,
            "completed",
        )
        return [Send(self._rebuilt_terminal(rnd.terminal_name, rnd.terminal)), Done(ok=ok)]

    def _failed(self, failure: Fail) -> list[Action]:
        self._state = "done"
        self._terminal_sent = True
        recall_involved = self.depth > 0 or any(r.recalls() for r in self._rounds)
        reason = failure.reason if failure.category in UPSTREAM_FAILURES else None
        text = with_reason(RECALL_FAILED_MESSAGE if recall_involved else GATEWAY_FAILED_MESSAGE,
                           reason)
        return [Send(self._failed_frame(text)), Done(ok=False, category=failure.category)]


def _visible_items(rnd: RoundState) -> list[dict[str, Any]]:
    items: list[RoundItem] = sorted(rnd.items.values(), key=lambda i: i.index)
    return [i.snapshot() for i in items if not i.recall]
