"""The chain machine: the recall policy, once, with plain events in and actions out."""

from __future__ import annotations

import pytest

from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.machine import (
    ChainMachine,
    ChainProtocolError,
    ChainState,
    Deliver,
    Fail,
    FollowUp,
    Round,
    RunRecall,
)

TEXT = Round(recalls=0, visible_tools=0, usable=True)
RECALL = Round(recalls=1, visible_tools=0, usable=False)
BLANK = Round(recalls=0, visible_tools=0, usable=False)


def machine() -> ChainMachine:
    return ChainMachine(RecallChainBudget())


def test_no_recall_delivers_as_is() -> None:
    m = machine()
    assert m.round(TEXT) == Deliver()
    assert m.state is ChainState.DONE and m.depth == 0


def test_recall_then_follow_up_then_deliver() -> None:
    m = machine()
    assert m.round(RECALL) == RunRecall()
    assert m.recall_ran() == FollowUp()
    assert m.round(TEXT) == Deliver()
    assert m.depth == 1


def test_mixed_visible_tools_deliver_without_follow_up() -> None:
    m = machine()
    assert m.round(Round(recalls=1, visible_tools=2, usable=True)) == RunRecall()
    assert m.recall_ran() == Deliver(mixed=True)


def test_parallel_recall_fails_without_recovery() -> None:
    m = machine()
    assert m.round(Round(recalls=2, visible_tools=0, usable=False)) == Fail(
        "parallel_recall", "more than one recall call in one response")


def test_unusable_continuation_gets_one_recovery() -> None:
    m = machine()
    m.round(RECALL)
    m.recall_ran()
    assert m.round(BLANK) == FollowUp(recovery=True)
    assert m.recovered_from == ("follow_up_failed", "recall continuation was not usable")
    assert isinstance(m.round(BLANK), Fail)  # the recovery must be usable too


def test_recovery_that_recalls_again_is_unsafe() -> None:
    m = machine()
    m.round(RECALL)
    m.recall_ran()
    assert m.follow_up_failed("follow_up_transport", "reset") == FollowUp(recovery=True)
    assert m.round(RECALL) == Fail("follow_up_failed", "upstream recovery output was unsafe")


def test_a_failed_recovery_fails_with_its_own_category() -> None:
    m = machine()
    m.round(RECALL)
    m.recall_ran()
    m.follow_up_failed("follow_up_failed", "500")
    assert m.follow_up_failed("follow_up_transport", "reset") == Fail(
        "follow_up_transport", "reset")


def test_a_relayed_stream_is_never_recovered() -> None:
    """A live continuation already reached the client: no second answer after it."""
    m = machine()
    m.round(RECALL)
    m.recall_ran()
    assert m.round(Round(0, 0, usable=False, relayed=True)) == Deliver()


def test_recall_in_the_final_round_is_depth_exhausted() -> None:
    budget = RecallChainBudget()
    m = ChainMachine(budget)
    m.round(RECALL)
    m.recall_ran()
    budget._final_round = True  # a bound was hit by the recall that just ran
    assert m.round(RECALL) == FollowUp(recovery=True)
    assert m.recovered_from is not None and m.recovered_from[0] == "depth_exhausted"


def test_principal_cut_short_fails() -> None:
    m = machine()
    assert m.round(Round(1, 0, usable=False, complete=False, reason="incomplete")) == Fail(
        "follow_up_failed", "incomplete")


def test_illegal_transitions_raise() -> None:
    m = machine()
    with pytest.raises(ChainProtocolError):
        m.recall_ran()
    m.round(TEXT)
    with pytest.raises(ChainProtocolError):
        m.round(TEXT)
