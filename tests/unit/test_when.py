"""Dates named in a recall query (``memory.when``): what is recognised, what is left alone."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lore_gateway.memory.search.when import find_dates

NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC).timestamp()


def _ts(day: str) -> float:
    return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()


def _covers(query: str, day: str) -> bool:
    return any(cue.covers(_ts(day)) for cue in find_dates(query, NOW).cues)


@pytest.mark.parametrize(("query", "inside", "outside"), [
    ("What did Gina find on 1 February, 2023?", "2023-02-01T20:00", "2023-02-05T12:00"),
    ("What painting did she show on October 13, 2023?", "2023-10-14T01:00", "2022-10-13T12:00"),
    ("which tests failed on 2024-03-05?", "2024-03-05T08:00", "2024-03-08T08:00"),
    ("What did Maria start in December 2023?", "2023-12-31T23:00", "2024-01-02T00:00"),
    ("How many times did she go to the beach in 2023?", "2023-07-01T00:00", "2022-12-30T00:00"),
    ("Which outdoor spot did Joanna visit in May?", "2019-05-20T00:00", "2019-06-02T00:00"),
    ("What did John do the week before August 3, 2023?", "2023-07-28T10:00", "2023-07-20T10:00"),
    ("what did we change yesterday", "2026-11-30T10:00", "2026-11-28T10:00"),
    ("the bug from two weeks ago", "2026-11-17T10:00", "2026-10-01T10:00"),
])
def test_named_dates_cover_their_days(query: str, inside: str, outside: str) -> None:
    assert _covers(query, inside)
    assert not _covers(query, outside)


def test_date_words_leave_the_text_and_other_words_stay() -> None:
    parsed = find_dates("What did Gina find for her store on 1 February, 2023?", NOW)
    assert "February" not in parsed.text and "2023" not in parsed.text
    assert "Gina find for her store" in parsed.text


@pytest.mark.parametrize("query", [
    "You may run it again",          # "may" the verb
    "the server on port 2023",       # a number, not a year
    "restart at 10:30 with may 2x",  # a time of day
    "bump the version to 2.31.0",
])
def test_things_that_are_not_dates_are_left_alone(query: str) -> None:
    parsed = find_dates(query, NOW)
    assert parsed.cues == () and parsed.text == query
