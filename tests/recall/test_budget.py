"""The per-request recall chain budget (lore-spec B.7)."""

from __future__ import annotations

import pytest

from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT, Coverage, RecallChainBudget
from lore_gateway.recall.core.tool import RecallArgs

SEARCH = RecallArgs(query="q")
DETAIL = RecallArgs(id="t:1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cov(n: int) -> list[Coverage]:
    return [Coverage(identity=f"t:{n}", revision="r")]


def test_at_least_twelve_executions_then_final_round() -> None:
    with pytest.raises(ValueError, match="at least 12"):
        RecallChainBudget(max_executions=5)
    budget = RecallChainBudget(max_executions=12)
    for n in range(12):
        assert budget.admit(DETAIL) is None
        budget.record("result", _cov(n))
        assert budget.final_round is (n == 11)
    assert budget.stop_reason == "execution"
    assert budget.admit(DETAIL) == "execution"
    text = budget.result_for_model("result")
    assert text.endswith(FINAL_ROUND_TEXT)
    assert "[Recall policy: stop further recall because execution." in text


def test_default_allows_24_executions() -> None:
    budget = RecallChainBudget()
    for n in range(23):
        assert budget.admit(DETAIL) is None
        budget.record("r", _cov(n))
    assert not budget.final_round
    assert budget.result_for_model("") == "[No results found.]"


def test_stalled_after_more_than_two_recalls_without_new_coverage() -> None:
    budget = RecallChainBudget()
    budget.admit(SEARCH)
    budget.record("r", _cov(1))
    for _ in range(2):
        budget.admit(SEARCH)
        budget.record("r", _cov(1))
        assert not budget.final_round
    budget.admit(SEARCH)
    budget.record("r", _cov(1))
    assert budget.final_round and budget.stop_reason == "stalled"


def test_result_bytes_items_and_time_bounds() -> None:
    budget = RecallChainBudget(max_result_bytes=10)
    budget.admit(SEARCH)
    budget.record("x" * 11, _cov(1))
    assert budget.stop_reason == "result_bytes"

    items = RecallChainBudget()
    assert items.admit(SEARCH) is None
    items.record("r", [Coverage(identity=f"t:{i}", revision="r") for i in range(40)])
    assert items.admit(SEARCH) == "items"  # 40 + a 30-item reservation > 64
    assert items.admit(DETAIL) is None

    clock = Clock()
    timed = RecallChainBudget(deadline_seconds=30, clock=clock)
    assert timed.admit(SEARCH) is None
    clock.now += 10.5  # past 30 s minus the 20 s finalisation reserve
    assert timed.admit(SEARCH) == "time"
    assert timed.can_recover()
    clock.now += 30
    assert not timed.can_recover()
