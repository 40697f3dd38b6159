"""The live Responses stream on the core chain machine: the rules it keeps of its
own (lore-spec C.1, C.5, C.7), as machine inputs and as what the client gets."""

from __future__ import annotations

import orjson

from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.core.machine import (
    ChainMachine,
    Deliver,
    Fail,
    FollowUp,
    Round,
    RunRecall,
)
from lore_gateway.recall.responses.live import Action, Done, LiveInterceptor, Send
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import fake_streams as fs

MODEL = "gpt-fake"
ANCHOR = "0b6c5d0e-8a4f-4c1e-9d2a-3f4b5c6d7e8f"
RECALL = Round(recalls=1, visible_tools=0, usable=False)


def _feed(icpt: LiveInterceptor, answer: fs.Answer) -> list[Action]:
    dec = SSEDecoder()
    out: list[Action] = []
    for event in [*dec.feed(b"".join(answer.frames)), *dec.close()]:
        out.extend(icpt.feed(event))
    return out + icpt.end_of_stream()


def _recall(query: str = "deploy target") -> fs.Answer:
    return fs.responses_call("recall", orjson.dumps({"query": query}).decode(), MODEL)


def _names(actions: list[Action]) -> list[str]:
    dec = SSEDecoder()
    data = b"".join(a.data for a in actions if isinstance(a, Send))
    return [e.name for e in [*dec.feed(data), *dec.close()] if e.has_data]


def _chain(icpt: LiveInterceptor) -> None:
    """A principal whose recall ran, and its follow-up about to be fed."""
    assert any(isinstance(a, RunRecall) for a in _feed(icpt, _recall()))
    assert isinstance(icpt.recall_done("r", ANCHOR)[-1], FollowUp)
    icpt.begin_continuation()


# --- the machine's inputs ---------------------------------------------------------------


def test_missing_output_names_an_unusable_continuation() -> None:
    m = ChainMachine(RecallChainBudget())
    m.round(RECALL)
    m.recall_ran()
    blank = Round(0, 0, usable=False, missing_output="follow_up_missing_output")
    assert m.round(blank) == FollowUp(recovery=True)
    assert m.recovered_from == ("follow_up_missing_output", "recall continuation was not usable")
    assert m.round(blank) == Fail("follow_up_missing_output",
                                  "upstream recovery output was unsafe")


def test_an_invalid_call_opens_no_recovery() -> None:
    m = ChainMachine(RecallChainBudget())
    m.round(RECALL)
    assert m.recall_ran(opens_recovery=False) == FollowUp()
    assert m.follow_up_failed("follow_up_transport", "reset") == Fail(
        "follow_up_transport", "reset")


def test_a_refused_recall_is_recovered_like_a_failed_continuation() -> None:
    m = ChainMachine(RecallChainBudget())
    m.round(RECALL)
    m.recall_ran()
    assert m.round(RECALL) == RunRecall()
    assert m.recall_refused("depth_exhausted", "time") == FollowUp(recovery=True)
    assert m.round(Round(0, 0, usable=True)) == Deliver()
    principal = ChainMachine(RecallChainBudget())
    principal.round(RECALL)
    assert principal.recall_refused("follow_up_protocol", "bad frame") == Fail(
        "follow_up_protocol", "bad frame")


# --- what the client gets ---------------------------------------------------------------


def test_failed_follow_up_after_an_invalid_call_fails_without_recovery() -> None:
    icpt = LiveInterceptor(budget=RecallChainBudget())
    run = next(a for a in _feed(icpt, _recall("x" * 600)) if isinstance(a, RunRecall))
    assert run.invalid is not None
    assert isinstance(icpt.recall_done("", None)[-1], FollowUp)
    icpt.begin_continuation()
    out = _feed(icpt, fs.responses_failed(MODEL))
    assert not any(isinstance(a, FollowUp) for a in out)
    assert _names(out) == ["response.failed"]
    assert out[-1] == Done(ok=False, category="follow_up_failed")


def test_incomplete_continuation_is_delivered_as_it_is() -> None:
    icpt = LiveInterceptor(budget=RecallChainBudget())
    _chain(icpt)
    out = _feed(icpt, fs.responses_incomplete("Partial answer", MODEL))
    assert _names(out)[-1] == "response.incomplete"
    assert "response.failed" not in _names(out)
    assert out[-1] == Done(ok=False)
    assert icpt.failure is None


def test_unusable_continuation_is_recovered_as_missing_output() -> None:
    icpt = LiveInterceptor(budget=RecallChainBudget())
    _chain(icpt)
    out = _feed(icpt, fs.responses_text("   ", MODEL, 1))
    assert not _names(out)  # the blank continuation never reached the client
    assert [a for a in out if isinstance(a, FollowUp)] == [
        FollowUp(recovery=True, items=out[-1].items)]  # type: ignore[union-attr]
    assert icpt.recovered_from is not None
    assert icpt.recovered_from[0] == "follow_up_missing_output"


def test_recall_refused_by_the_budget_mid_chain_is_recovered() -> None:
    now = [0.0]
    budget = RecallChainBudget(clock=lambda: now[0], deadline_seconds=100.0)
    icpt = LiveInterceptor(budget=budget)
    _chain(icpt)
    now[0] = 90.0  # past the deadline (100 s less the reserve), still in time to recover
    out = _feed(icpt, _recall("another query"))
    follow = [a for a in out if isinstance(a, FollowUp)]
    assert not any(isinstance(a, RunRecall) for a in out)
    assert len(follow) == 1 and follow[0].recovery
    assert icpt.recovered_from is not None and icpt.recovered_from[0] == "depth_exhausted"
    icpt.begin_continuation(recovery=True)
    final = _feed(icpt, fs.responses_text("Recovered.", MODEL))
    assert _names(final)[-1] == "response.completed"
    assert final[-1] == Done(ok=True)
