"""The supersession rule (``memory/search/supersede.py``): pure, text in and hits out."""

from __future__ import annotations

import pytest

from lore_gateway.memory.search.hits import Hit, SearchResult
from lore_gateway.memory.search.render import render
from lore_gateway.memory.search.supersede import Statement, changed_subject, statements, supersede


def hit(mid: int, content: str, at: float, score: float, role: str = "user") -> Hit:
    return Hit(ref=f"t:{mid}", score=score, role=role, content=content, created_at=at,
               session="s", project="/p", meta=None)


@pytest.mark.parametrize(("text", "expected"), [
    ("Decision: the datastore is Postgres.", ("datastore", "postgres")),
    ("Switched the datastore from Postgres to SQLite.", ("datastore", "sqlite")),
    ("Use DuckDB for the datastore, since analytics dominate.", ("datastore", "duckdb")),
    ("Set the cache TTL to 30 s.", ("cache ttl", "30s")),
    ("ok, the cache TTL is now 300s because 30 s thrashed", ("cache ttl", "300s")),
    ("ttl = 30s", ("ttl", "30s")),
    ("python version: 3.11", ("python version", "3.11")),
    ("config path → /etc/lore/lore.toml", ("config path", "/etc/lore/lore.toml")),
    ("The datastore: Postgres -> SQLite", ("datastore", "sqlite")),
])
def test_a_statement_names_its_subject_and_value(text: str, expected: tuple[str, str]) -> None:
    assert statements(text)[0] == Statement(*expected)


def test_key_value_stands_on_its_own_line() -> None:
    assert statements("notes\nDatastore: SQLite\n") == [Statement("datastore", "sqlite")]
    # Opening a longer line, "Name:" is a transcript's speaker, not a subject.
    assert statements("Caroline: Thanks, Mel! Next month I have an art show.") == []


@pytest.mark.parametrize("text", [
    "What is the cache TTL?",
    "Is the datastore Postgres",
    "It is what it is.",
    "The reason we kept the old build scripts around for the release branch is history.",
    "The plan is to read every file in the repository and then write a summary of each "
    "module with its tests, its callers and its open questions.",
])
def test_questions_prose_and_long_values_state_nothing(text: str) -> None:
    assert statements(text) == []


def test_same_subject_different_value_supersedes() -> None:
    assert changed_subject("the cache TTL is 30 s", "Set the cache TTL to 300 s.") == "cache ttl"


def test_different_subjects_do_not() -> None:
    assert changed_subject("the cache TTL is 30 s", "the session TTL is 300 s") is None


def test_the_same_value_repeated_is_not_supersession() -> None:
    assert changed_subject("the cache TTL is 30s", "ok, the cache TTL is 30 s") is None
    hits = [hit(1, "the cache TTL is 30s", 1.0, 0.9), hit(2, "cache TTL = 30 s", 2.0, 0.8)]
    assert supersede(hits) == hits


def test_the_newest_value_comes_first_and_older_ones_follow_it_labelled() -> None:
    hits = [hit(1, "Decision: the datastore is Postgres.", 100.0, 1.0),
            hit(5, "The build runs on CI.", 150.0, 0.9),
            hit(2, "Decision: switch the datastore from Postgres to SQLite.", 200.0, 0.7),
            hit(3, "Decision: use DuckDB for the datastore.", 300.0, 0.4),
            hit(4, "We always rebase.", 310.0, 0.3, role="assistant")]
    out = supersede(hits, "Which datastore did we pick?")
    # The stale ones move down to just below their successor; nothing else moves.
    assert [h.ref for h in out] == ["t:5", "t:3", "t:2", "t:1", "t:4"]
    assert [h.superseded_by for h in out] == ["", "", "t:3", "t:3", ""]
    # The scores stay where they were: still best first.
    assert [h.score for h in out] == [1.0, 0.9, 0.7, 0.4, 0.3]


def test_a_question_about_something_else_labels_but_moves_nothing() -> None:
    # Conversation reads as statements; evidence for another question stays put.
    hits = [hit(1, "my favourite band is Muse", 100.0, 1.0),
            hit(2, "The concert was in Berlin.", 150.0, 0.9),
            hit(3, "my favourite band is Blur", 200.0, 0.7)]
    out = supersede(hits, "Where did Mel see the concert?")
    assert [h.ref for h in out] == ["t:1", "t:2", "t:3"]
    assert [h.superseded_by for h in out] == ["t:3", "", ""]


def test_a_subject_with_many_values_is_a_label_not_a_setting() -> None:
    # A transcript's speaker opens every line: not a decision changing each time.
    lines = ["Caroline: Thanks", "Caroline: Hey Mel", "Caroline: Sounds great",
             "Caroline: Totally agree"]
    hits = [hit(i, text, 100.0 + i, 1.0 - i / 10) for i, text in enumerate(lines)]
    assert {s.subject for text in lines for s in statements(text)} == {"caroline"}
    assert supersede(hits, "What did Caroline paint?") == hits


def test_an_older_repeat_of_the_current_value_is_not_superseded() -> None:
    hits = [hit(1, "the cache TTL is 300s", 100.0, 1.0),
            hit(2, "the cache TTL is 30s", 200.0, 0.9),
            hit(3, "the cache TTL is 300 s", 300.0, 0.8)]
    out = supersede(hits, "what is the cache TTL?")
    assert {h.ref: h.superseded_by for h in out} == {"t:1": "", "t:2": "t:3", "t:3": ""}
    assert [h.ref for h in out] == ["t:1", "t:3", "t:2"]


def test_another_projects_value_is_not_a_successor() -> None:
    hits = [hit(1, "the datastore is Postgres", 100.0, 1.0),
            Hit("t:2", 0.5, "user", "the datastore is SQLite", 200.0, "s2", "/other", None)]
    assert supersede(hits) == hits


def test_a_listing_states_nothing() -> None:
    dump = "\n".join(f"option{i} = value{i}" for i in range(5))
    assert statements("option1 = value1") and statements(dump) == []
    assert statements("x = foo(bar)") == [] and statements("THOUGHT: I need to read the file") == []


def test_tool_output_is_never_compared() -> None:
    hits = [hit(1, "[tool:c1] ttl = 30s", 100.0, 1.0, role="tool"),
            hit(2, "ttl = 300s", 200.0, 0.5)]
    assert supersede(hits) == hits


def test_the_rendered_line_names_the_successor() -> None:
    hits = supersede([hit(1, "the cache TTL is 30s", 100.0, 1.0),
                      hit(2, "the cache TTL is 300s", 200.0, 0.9)], "cache TTLs")
    text = render(SearchResult("cache TTL", "all", hits, 2, "/p"), now=300.0)
    lines = [line for line in text.splitlines() if line.startswith("- (")]
    assert lines[0].endswith("the cache TTL is 300s (t:2)")
    assert lines[1].endswith("the cache TTL is 30s (t:1) (superseded by t:2)")
