"""The recall chain policy, once, as a sans-IO state machine (h11 style).

Every protocol and both delivery modes drive the same :class:`ChainMachine`:
the driver reads an upstream answer (a stream fed through the protocol's
interceptor, or a JSON body), summarises it as a :class:`Round`, and asks the
machine what to do next. The machine answers with one action:

``RunRecall``  execute the round's single recall call
``FollowUp``   send the follow-up (``recovery``: the final-round recovery request)
``Deliver``    the client gets what it has (``mixed``: the model also called a
               visible tool, so no follow-up; the recall replays next turn)
``Fail``       the chain cannot deliver; ``category`` is the lore-spec C.7 code

States and transitions (anything else is a bug in the driver and raises)::

    AWAIT_ANSWER --round--> RECALLING --recall_ran--> AWAIT_ANSWER (FollowUp)
                 |                                 `-> DONE (Deliver mixed)
                 `--round--> DONE (Deliver | Fail) | AWAIT_ANSWER (FollowUp recovery)
    AWAIT_ANSWER --follow_up_failed--> AWAIT_ANSWER (FollowUp recovery) | DONE (Fail)
    RECALLING --recall_refused--> AWAIT_ANSWER (FollowUp recovery) | DONE (Fail)

The policy (lore-spec C.1, C.3, C.7): more than one recall in a round is
``parallel_recall``; a recall in the final round is ``depth_exhausted``; a
continuation that failed, was cut short or is not usable gets one recovery
request (the final-round instruction, so the model answers without recall) when
the budget allows; a recovery answer that recalls again or is not usable fails.

The drivers (``core/driver.py``) ask their adapter for the call and the
follow-up; the live Responses interceptor, a sans-IO machine of its own that
the machine's decisions drive, hands its shell the same actions filled in
(``RunRecall`` with the admitted call, ``FollowUp`` with its items). Three
inputs carry what the live Responses path keeps of its own (lore-spec C.1,
C.5): an unusable continuation's category (``Round.missing_output``), a call
refused after the round asked for it (``recall_refused``, recovered like a
failed continuation) and an invalid call that opens no recovery
(``recall_ran(opens_recovery=False)``).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import msgspec

from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.chain import NOT_RECOVERABLE, FailureCategory
from lore_gateway.recall.core.tool import RecallArgs, RecallArgumentError


class ChainState(Enum):
    AWAIT_ANSWER = "await_answer"
    RECALLING = "recalling"
    DONE = "done"


# The round and the actions are frozen msgspec Structs, not frozen dataclasses,
# as every request builds some: a Struct is built in C (about 1.5 K instructions
# for five fields, callgrind) where a frozen dataclass's generated __init__ calls
# object.__setattr__ once a field (about 10 K).


class Round(msgspec.Struct, frozen=True):
    """What the driver saw of one upstream answer.

    ``complete``: it ended normally (False: failed, cancelled or cut short; then
    ``reason`` says how). ``usable``: lore-spec C.1 "usable continuation" (some
    text, a refusal or a visible tool call, and not cut short).
    """

    recalls: int
    visible_tools: int
    usable: bool
    complete: bool = True
    reason: str = ""
    # Already relayed to the client (a live stream): it cannot be taken back, so
    # it is never recovered; an unusable one is what the client has.
    relayed: bool = False
    # The category a complete but unusable continuation fails with: the live
    # Responses path names it ``follow_up_missing_output`` (lore-spec C.1).
    missing_output: FailureCategory = "follow_up_failed"


class RunRecall(msgspec.Struct, frozen=True):
    """Execute the round's recall. The machine returns it bare; the live
    Responses interceptor, which admits the call itself, fills in the call's
    id and arguments text and either the parsed ``args`` or why they are
    ``invalid`` (then the shell only reports back)."""

    call_id: str = ""
    arguments: str = ""
    args: RecallArgs | None = None
    invalid: RecallArgumentError | None = None


class FollowUp(msgspec.Struct, frozen=True):
    """Send the follow-up. ``items``: what it appends to the request's input,
    when the adapter hands them over with the action (live Responses); the
    other adapters keep their follow-up history themselves."""

    recovery: bool = False
    items: tuple[dict[str, Any], ...] = ()


class Deliver(msgspec.Struct, frozen=True):
    mixed: bool = False


class Fail(msgspec.Struct, frozen=True):
    category: FailureCategory
    reason: str


ChainAction = RunRecall | FollowUp | Deliver | Fail


class ChainProtocolError(RuntimeError):
    """The driver called the machine in a state that does not allow it."""


class ChainMachine:
    """The recall chain of one client request."""

    def __init__(self, budget: RecallChainBudget) -> None:
        self._budget = budget
        self.state = ChainState.AWAIT_ANSWER
        self.depth = 0  # recalls that ran
        self._recoverable = 0  # of those, the ones that open recovery
        self.recovering = False
        self.recovered_from: tuple[FailureCategory, str] | None = None
        self.failure: Fail | None = None
        self.visible_tools = 0

    def _expect(self, state: ChainState, event: str) -> None:
        if self.state is not state:
            raise ChainProtocolError(f"{event} in state {self.state.value}")

    def round(self, answer: Round) -> ChainAction:
        """An upstream answer (the principal, a continuation or the recovery) ended."""
        self._expect(ChainState.AWAIT_ANSWER, "round")
        if self.recovering:
            if answer.recalls or not answer.complete:
                return self._fail("follow_up_failed", "upstream recovery output was unsafe")
            if not answer.usable:
                return self._fail(answer.missing_output, "upstream recovery output was unsafe")
            return self._done(Deliver())
        if not answer.complete:
            if self.depth == 0 or answer.relayed:
                return self._fail("follow_up_failed", answer.reason or "answer incomplete")
            return self._recover_or_fail("follow_up_failed", answer.reason or "incomplete")
        if answer.recalls > 1:
            return self._fail("parallel_recall", "more than one recall call in one response")
        if answer.recalls == 1:
            if self.depth and self._budget.final_round:
                if answer.relayed:
                    return self._fail("depth_exhausted", "recall requested in the final round")
                return self._recover_or_fail("depth_exhausted",
                                             "recall requested in the final round")
            self.visible_tools = answer.visible_tools
            self.state = ChainState.RECALLING
            return RunRecall()
        if self.depth and not answer.usable and not answer.relayed:
            return self._recover_or_fail(answer.missing_output,
                                         "recall continuation was not usable")
        return self._done(Deliver())

    def recall_ran(self, *, opens_recovery: bool = True) -> ChainAction:
        """The round's recall ran (or was answered as an invalid call).
        ``opens_recovery=False``: it does not make a later failure recoverable
        (the live Responses path: an invalid call, which searched nothing)."""
        self._expect(ChainState.RECALLING, "recall_ran")
        self.depth += 1
        self._recoverable += opens_recovery
        if self.visible_tools:
            return self._done(Deliver(mixed=True))
        self.state = ChainState.AWAIT_ANSWER
        return FollowUp()

    def follow_up_failed(self, category: FailureCategory, reason: str) -> ChainAction:
        """A follow-up (or the recovery) could not be sent or read."""
        self._expect(ChainState.AWAIT_ANSWER, "follow_up_failed")
        if self.recovering:
            return self._fail(category, reason)
        return self._recover_or_fail(category, reason)

    def recall_refused(self, category: FailureCategory, reason: str) -> ChainAction:
        """The round's recall cannot run (its arguments are a broken frame, or the
        budget refuses it): the live Responses path fails the round as it fails
        a continuation, so one recovery may answer it."""
        self._expect(ChainState.RECALLING, "recall_refused")
        self.state = ChainState.AWAIT_ANSWER
        return self._recover_or_fail(category, reason)

    def fail(self, category: FailureCategory, reason: str) -> Fail:
        """The driver hit a failure of its own (a refused recall, a broken frame)."""
        return self._fail(category, reason)

    def _recover_or_fail(self, category: FailureCategory, reason: str) -> ChainAction:
        if (self._recoverable and not self.recovering and category not in NOT_RECOVERABLE
                and self._budget.can_recover()):
            self.recovering = True
            self.recovered_from = (category, reason)
            return FollowUp(recovery=True)
        return self._fail(category, reason)

    def _fail(self, category: FailureCategory, reason: str) -> Fail:
        failure = Fail(category, reason)
        self.failure = failure
        self.state = ChainState.DONE
        return failure

    def _done(self, action: Deliver) -> Deliver:
        self.state = ChainState.DONE
        return action
