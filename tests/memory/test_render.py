"""The recall result text (lore-spec B.4): tiers, line shape, footer, budget."""

from __future__ import annotations

from dataclasses import replace

from lore_gateway.memory.search.hits import Previous
from lore_gateway.memory.search.render import NO_RESULTS, render
from lore_gateway.memory.search.searcher import Hit, SearchResult

NOW = 1_800_000_000.0


def _hit(i: int, score: float, content: str, age_s: float = 7200) -> Hit:
    return Hit(ref=f"t:{i}", score=score, role="assistant" if i % 2 else "user",
               content=content, created_at=NOW - age_s, session="s", project="p", meta=None)


def _result(*hits: Hit, total: int | None = None) -> SearchResult:
    return SearchResult(query="q", scope="all", hits=list(hits),
                        total=total if total is not None else len(hits))


def test_no_hits() -> None:
    assert render(_result(), now=NOW) == NO_RESULTS == "No results found for this query."


def test_tiers_lines_and_footer() -> None:
    text = render(_result(_hit(1, 1.0, "alpha  beta\n gamma"), _hit(2, 0.4, "delta"),
                          _hit(3, 0.2, "epsilon", age_s=3 * 86400), total=7), now=NOW)
    lines = text.splitlines()
    assert lines[0] == "## Recall Results"
    assert lines[1] == "Found 7 results, showing top 3 (score range: 0.20–1.00)."
    assert "### Strong Matches" in lines and "### Supporting" in lines
    assert "### Peripheral" in lines
    assert "- (assistant, 2h ago) alpha beta gamma (t:1)" in lines
    assert "- (user, 2h ago) delta (t:2)" in lines
    assert "- (assistant, 3d ago) epsilon (t:3)" in lines
    assert lines[-2:] == ["---", "*3 of 7 results shown.*"]
    assert lines.index("### Strong Matches") < lines.index("### Supporting")


def test_relevance_floor_keeps_three_and_caps_at_fifteen() -> None:
    weak = [_hit(i, 0.05, f"weak {i}") for i in range(1, 6)]
    text = render(_result(_hit(0, 1.0, "top"), *weak), now=NOW)
    assert "(t:0)" in text and "(t:1)" in text and "(t:2)" in text and "(t:3)" not in text
    many = [_hit(i, 0.9, f"item {i}") for i in range(30)]
    assert "showing top 15" in render(_result(*many), now=NOW)


def test_budget_truncates_long_content_and_says_so() -> None:
    long = "x" * 50_000
    hits = [_hit(i, 1.0 - i / 20, long) for i in range(10)]
    text = render(_result(*hits), budget_chars=3000, now=NOW)
    assert len(text) <= 3000
    assert "…" in text
    assert text.endswith("Use recall with id parameter to see full content of truncated "
                         "results.*")
    assert "(t:0)" in text  # the id survives truncation


def test_a_cut_result_shows_the_part_with_the_query_words() -> None:
    """A detail deep in a 40 KB tool output is what the model gets to see."""
    output = "ok line\n" * 4_000 + "FAILED tests/test_spin.py::test_wobble - ZeroDivisionError" \
        + "\nok line" * 1_000
    hit = _hit(1, 0.9, output)
    text = render(SearchResult(query="which test failed with ZeroDivisionError?", scope="all",
                               hits=[hit], total=1), budget_chars=2_000, now=NOW)
    line = next(x for x in text.splitlines() if x.startswith("- ("))
    assert "test_wobble - ZeroDivisionError" in line
    assert line.startswith("- (assistant, 2h ago) …") and line.endswith(" ok line (t:1)")
    assert "ZeroDivisionError ok line" in line and "… ok line" in line  # and the end
    # Without the words in it, the head is shown, as before.
    head = render(SearchResult(query="unrelated words", scope="all", hits=[hit], total=1),
                  budget_chars=2_000, now=NOW)
    assert "- (assistant, 2h ago) ok line ok line" in head


def test_a_hit_shows_the_message_before_it_in_its_room() -> None:
    """The previous message a hit carries is shown under it, named by its id, and
    the two share the hit's room: half each, what one leaves going to the other."""
    command = "THOUGHT: run it\n```bash\npython3 repro.py\n```"
    hit = replace(_hit(1, 1.0, "ZeroDivisionError: division by zero"),
                  previous=Previous(ref="t:0", role="assistant", content=command))
    lines = render(_result(hit), now=NOW).splitlines()
    at = lines.index("- (assistant, 2h ago) ZeroDivisionError: division by zero (t:1)")
    assert lines[at + 1] == ("  (before it: assistant, t:0) "
                             "THOUGHT: run it ```bash python3 repro.py ```")
    long_output = "\n".join(f"line {i} of the output" for i in range(400))
    long_command = "\n".join(f"step {i} of the command" for i in range(400))
    big = replace(_hit(1, 1.0, long_output),
                  previous=Previous(ref="t:0", role="assistant", content=long_command))
    text = render(_result(big), budget_chars=2000, now=NOW)
    own, before = (line for line in text.splitlines() if "(t:1)" in line or "(before it" in line)
    assert abs(len(own) - len(before)) < 120  # each about half the room
