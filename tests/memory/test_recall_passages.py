"""A cut recall hit shows the matching passage in whole lines (issue 32, item 5).

A long tool output is cut to fit the recall result; the part shown is the lines
around the query's words, whole, so a traceback, a summary line or a function is
not cut in half. A strong match may take more room than the spec's 1,200
characters when the rest of the result is short, and the block never exceeds its
budget.
"""

from __future__ import annotations

import re

from lore_gateway.memory.search.passage import passage
from lore_gateway.memory.search.render import MAX_RESULT_CHARS, render
from lore_gateway.memory.search.searcher import Hit, SearchResult
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.protocols.common import Message

TENANT = "tenant-passages"
PROJECT = "/home/dev/src/ospreys"
NOW = 1_800_000_000.0
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/srv/ospreys/nest.py", line 88, in test_clutch_rotation',
    "    assert rotate(clutch, degrees=90) == expected",
    '  File "/srv/ospreys/clutch.py", line 41, in rotate',
    "    return clutch.turn(degrees / clutch.eggs)",
    "ZeroDivisionError: division by zero (clutch has no eggs)",
]
# Whole lines of ``_progress`` as a result line shows them (whitespace collapsed).
PROGRESS_LINES = re.compile(r"(?: ?tests/test_nest\.py::test_perch_\d+ PASSED ?\[ ?\d+%\] ?)*")


def _progress(first: int, count: int) -> list[str]:
    return [f"tests/test_nest.py::test_perch_{n} PASSED{' ' * (n % 7)}[ {n % 100:>2}%]"
            for n in range(first, first + count)]


def _shown(line: str) -> str:
    """The text of a result line ``- (role, age) text (t:N)``."""
    return line.split(") ", 1)[1].rsplit(" (t:", 1)[0]


def test_a_traceback_in_the_middle_of_a_long_output_comes_back_whole(memory: Memory) -> None:
    output = "\n".join([*_progress(0, 400), *TRACEBACK, *_progress(400, 400)])
    turn = TurnRecord(Identity(TENANT, PROJECT, "run"), "responses", "m",
                      (Message("tool", f"[tool:call_9] {output}"),), 1.7e9)
    assert memory.submit_turn(turn)
    memory.flush(10)
    result = memory.search_sync("why did test_clutch_rotation fail with ZeroDivisionError",
                                identity=Identity(TENANT, PROJECT, "asking"))
    assert len(output) > 20 * MAX_RESULT_CHARS
    text = memory.render(result)
    line = next(x for x in text.splitlines() if x.startswith("- (tool"))
    assert line.endswith(f"test_perch_799 PASSED [ 99%] ({result.hits[0].ref})")
    shown = _shown(line)
    # The lines around the match, then "…" and the output's last lines (its end).
    body, end = shown.rsplit("… ", 1)
    assert body.startswith("…") and PROGRESS_LINES.fullmatch(end), shown
    # Every line of the traceback, first to last, whole and in order.
    whole = " ".join(" ".join(x.split()) for x in TRACEBACK)
    assert whole in body
    # What surrounds it is whole lines of the output too, never half of one.
    before, after = body.removeprefix("…").split(whole)
    assert PROGRESS_LINES.fullmatch(before) and PROGRESS_LINES.fullmatch(after), shown
    assert "Use recall with id parameter" in text


def test_a_strong_match_takes_more_than_the_spec_cap_when_the_block_has_room() -> None:
    long = "\n".join([*_progress(0, 300), *TRACEBACK, *_progress(300, 300)])
    hits = [Hit("t:1", 0.95, "tool", long, NOW - 60, "s", "p", None),
            Hit("t:2", 0.5, "assistant", "Rotating an empty clutch divides by zero.",
                NOW - 60, "s", "p", None)]
    text = render(SearchResult("clutch rotation ZeroDivisionError", "all", hits, 2), now=NOW)
    line = next(x for x in text.splitlines() if x.endswith("(t:1)"))
    assert MAX_RESULT_CHARS < len(_shown(line)) <= 3 * MAX_RESULT_CHARS
    assert " ".join(" ".join(x.split()) for x in TRACEBACK) in line
    assert "Rotating an empty clutch divides by zero. (t:2)" in text


def test_the_block_stays_within_its_budget_and_every_cut_line_keeps_its_id() -> None:
    long = "\n".join([*_progress(0, 300), *TRACEBACK, *_progress(300, 300)])
    hits = [Hit(f"t:{n}", 1.0 - n / 30, "tool", long + f"\nrun {n}", NOW - 60, "s", "p",
                None, folded=tuple(f"t:{100 + n * 10 + k}" for k in range(n % 4)))
            for n in range(15)]
    for budget in (1_500, 4_000, 12_000, 30_000):
        text = render(SearchResult("clutch ZeroDivisionError", "all", hits, 40),
                      budget_chars=budget, now=NOW)
        assert len(text) <= budget
        lines = [x for x in text.splitlines() if x.startswith("- (")]
        assert lines
        for n, line in enumerate(lines):
            assert "…" in line and f" run {n} (t:{n})" in line, line  # cut; its end shown
            assert "ZeroDivisionError: division by zero (clutch has no eggs)" in line
        assert text.endswith("to see full content of truncated results.*")


def test_a_long_single_line_is_cut_at_spaces_around_the_words() -> None:
    words = " ".join(f"word{n}" for n in range(2_000))
    text = passage(f"{words} the heron needle {words}", ["needle"], 300)
    assert len(text) <= 300 and "heron needle" in text
    assert text.startswith("…word") and text.endswith("…")
    assert all(w.startswith(("word", "the", "heron", "needle")) for w in text.strip("…").split())


def test_the_paragraph_around_the_match_comes_before_other_lines() -> None:
    before = "\n".join(f"setup step {n}" for n in range(40))
    block = "def rotate(clutch, degrees):\n    eggs = clutch.eggs\n    return degrees / eggs"
    after = "\n".join(f"teardown step {n}" for n in range(40))
    text = passage(f"{before}\n\n{block}\n\n{after}", ["rotate"], 120)
    assert " ".join(block.split()) in text
    assert text.startswith("…") and text.endswith("… teardown step 39")


def test_the_end_of_a_long_output_is_shown_beside_the_match() -> None:
    """A command's outcome ends its output (the test run's summary, the exit):
    the last lines are shown after the lines around the query's words."""
    run = "\n".join([*_progress(0, 300), *TRACEBACK, *_progress(300, 300),
                     "===== 1 failed, 599 passed in 12.31s ====="])
    text = passage(run, ["zerodivisionerror"], 1_000)
    assert len(text) <= 1_000
    assert "ZeroDivisionError: division by zero (clutch has no eggs)" in text
    assert text.endswith("[ 99%] ===== 1 failed, 599 passed in 12.31s =====")
