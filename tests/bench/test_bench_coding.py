"""``lore bench coding``: both question sets, every scope, the naive baseline, the
held-out part, noise counts and a reusable store, on small samples through the real
CLI; the baseline reproduces the shared script's published figures on the real set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lore_gateway.bench import coding_data, coding_score
from lore_gateway.bench.coding_data import NATURAL, RULE, Question
from lore_gateway.bench.coding_score import Found, NaiveIndex, Noise, Tally, outcome
from lore_gateway.cli.main import _register, app

SHARED = Path(__file__).resolve().parents[3] / "shared/data/coding-sessions"
# The 8 sessions the fixed rule holds out (docs/search.md): a change to the rule
# would silently move questions someone has tuned on into the held-out part.
HELD_OUT_SESSIONS = {
    "django__django-16333", "sympy__sympy-21612", "django__django-13109",
    "django__django-12273", "psf__requests-5414", "psf__requests-1921",
    "sphinx-doc__sphinx-8056", "pydata__xarray-2905"}


def _session(sid: str, topic: str) -> dict[str, Any]:
    contents = [
        ("user", f"Fix the crash in {topic}.spin() when the wheel is empty"),
        ("assistant", f"THOUGHT: find where spin is defined.\n```bash\ngrep -rn 'def spin' "
                      f"src/{topic}\n```"),
        ("tool", f"src/{topic}/widget.py:41:def spin(self):"),
        ("assistant", "THOUGHT: run the tests.\n```bash\npytest -q\n```"),
        ("tool", f"FAILED tests/test_{topic}.py::test_empty_wheel - ZeroDivisionError"),
        ("tool", "<returncode>0</returncode>\n<output>\n</output>"),
        ("tool", "<returncode>0</returncode>\n<output>\n</output>"),
        ("assistant", "THOUGHT: guard against the empty wheel and rerun."),
        ("tool", "3 passed in 0.12s"),
    ]
    return {"session_id": sid, "source": {}, "messages": [
        {"index": i, "role": role, "content": text} for i, (role, text) in enumerate(contents)]}


def _sample(tmp_path: Path, natural: bool = True) -> Path:
    sessions = [_session("s-gear", "gear"), _session("s-cog", "cog")]
    questions = [{"kind": "definition_location", "session_id": sid, "message_index": 2,
                  "question": f"In which file and at which line is `spin` defined for {t}?",
                  "answer": "", "evidence": f"src/{t}/widget.py:41", "gold_indices": [2]}
                 for sid, t in (("s-gear", "gear"), ("s-cog", "cog"))]
    path = tmp_path / "coding_eval.json"
    path.write_text(json.dumps({"sessions": sessions, "questions": questions}))
    if natural:
        (tmp_path / "natural_questions.json").write_text(json.dumps({"questions": [
            {"id": "nq-s-gear-1", "session_id": "s-gear", "kind": "error",
             "position": "middle", "question": "Which error did the gear test hit when the "
             "wheel had nothing on it?", "answer": "", "message_index": 4,
             "gold_indices": [4], "key_facts": ["ZeroDivisionError"]}]}))
    return path


def _run(*args: str) -> dict[str, Any]:
    _register()
    out = CliRunner().invoke(app, ["bench", "coding", *args, "--no-embeddings", "--json"])
    assert out.exit_code == 0, out.output
    figures: dict[str, Any] = json.loads(out.output.strip().splitlines()[-1])
    return figures


def test_both_sets_every_scope_against_the_naive_baseline(tmp_path: Path) -> None:
    figures = _run("--data", str(_sample(tmp_path)))
    assert set(figures["sets"]) == {NATURAL, RULE}
    for name in (NATURAL, RULE):
        for mode in ("session", "all", "multi_project"):
            per = figures["sets"][name][mode]
            assert set(per) == {"lore", "naive", "diff"}
            assert {"all", "tuning", "held_out"} <= set(per["lore"])
            assert set(per["lore"]["all"]) == {"n", "hit@1", "hit@5", "hit@10", "exact@10",
                                               "mrr", "kf_all@10", "kf_frac@10"}
            assert per["diff"]["all"]["hit@10"] == round(
                per["lore"]["all"]["hit@10"] - per["naive"]["all"]["hit@10"], 4)
    assert figures["sets"][RULE]["session"]["lore"]["all"]["n"] == 2
    assert figures["sets"][NATURAL]["session"]["lore"]["all"]["n"] == 1
    assert figures["sets"][NATURAL]["session"]["lore"]["kind:error"]["n"] == 1
    # The multi-project figures compare with the naive baseline over all sessions.
    assert (figures["sets"][RULE]["multi_project"]["naive"]
            == figures["sets"][RULE]["all"]["naive"])
    # The figures cited before issue 33 stay where they were.
    assert figures["lore"]["all"]["exact"]["hit@10"] == 1.0
    assert set(figures["baseline"]["all"]) == {"exact", "tol2"}
    assert figures["messages"] == 18
    assert figures["stored_rows"] > 18  # the noise rows
    assert set(figures["noise"]) == {"lore", "naive"}


def test_the_natural_set_is_left_out_when_its_file_is_absent(tmp_path: Path) -> None:
    figures = _run("--data", str(_sample(tmp_path, natural=False)))
    assert set(figures["sets"]) == {RULE}


def test_without_noise_the_sessions_are_stored_alone(tmp_path: Path) -> None:
    figures = _run("--data", str(_sample(tmp_path)), "--no-noise")
    assert figures["stored_rows"] == figures["messages"] == 18
    assert not figures["noise_rows"]


def test_a_store_is_reused_and_a_foreign_directory_refused(tmp_path: Path) -> None:
    data = _sample(tmp_path)
    store = tmp_path / "store"
    first = _run("--data", str(data), "--store", str(store))
    second = _run("--data", str(data), "--store", str(store))
    assert not first["store_reused"] and second["store_reused"]
    assert first["sets"] == second["sets"]
    # Other data: the outdated bench store is rebuilt, not reused.
    (tmp_path / "natural_questions.json").unlink()
    assert not _run("--data", str(data), "--store", str(store))["store_reused"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "lore.db").write_bytes(b"")
    _register()
    out = CliRunner().invoke(app, ["bench", "coding", "--data", str(data), "--store",
                                   str(foreign), "--no-embeddings"])
    assert out.exit_code == 2 and "not a `lore bench coding` store" in out.output


def _question(golds: tuple[int, ...], facts: tuple[str, ...] = ()) -> Question:
    return Question(NATURAL, "q", "s", "error", "middle", "?", golds[0], golds, facts)


def test_hits_count_within_two_of_any_gold_and_facts_verbatim() -> None:
    q = _question((10, 30), ("ZeroDivisionError: division by zero",))
    found = [Found("s", 50, "nothing"), Found("other", 30, "ZeroDivisionError: division "
                                                          "by zero"),
             Found("s", 28, "near the second gold"), Found("s", 30, "the gold")]
    result = outcome(q, found)
    # Another session's message 30 is not the gold, though its text holds the fact.
    assert (result.tol, result.exact, result.facts_found) == (3, 4, 1)
    assert (result.legacy_exact, result.legacy_tol) == (None, None)  # message_index 10
    tally = Tally([result, outcome(q, [])])
    figures = tally.figures()
    assert figures["hit@1"] == 0 and figures["hit@5"] == 0.5 and figures["mrr"] == round(
        1 / 3 / 2, 4)
    assert figures["kf_all@10"] == 0.5 and figures["kf_frac@10"] == 0.5


def test_a_fact_in_the_message_a_hit_carries_counts_but_not_as_a_hit() -> None:
    """The recall shows the message before a hit under it (``Hit.previous``), so a
    key fact there is read; its index is not the hit's, so no ±2 window moves."""
    q = _question((5,), ("3 passed in 0.12s", "pytest -q"))
    found = [Found("s", 20, "3 passed in 0.12s", previous="THOUGHT: run them\npytest -q")]
    result = outcome(q, found)
    assert (result.tol, result.exact, result.facts_found) == (None, None, 2)
    assert outcome(q, [Found("s", 20, "3 passed in 0.12s")]).facts_found == 1


def test_a_hit_stands_for_the_copies_folded_into_it() -> None:
    """Folding a copy into the best-ranked one (``Hit.folded``, named by the recall)
    must not lose the position the copy held: its index counts as the hit's."""
    q = _question((134,))
    hit = Found("s", 118, "diff --git a/lib/text.py", copies=(134,))
    assert (outcome(q, [hit]).tol, outcome(q, [hit]).exact) == (1, 1)
    assert outcome(q, [Found("s", 118, "diff --git a/lib/text.py")]).tol is None


def test_noise_counts_duplicates_side_channels_and_recall_traffic() -> None:
    noise = Noise()
    noise.add([Found("s", 1, "a  b"), Found("s", 2, "a b"), Found("t", None, "x",
                                                                   side_channel=True),
               Found.of("s", '[tool_call:recall] {"query": "x"}', None)])
    noise.add([Found("s", 3, "clean")])
    assert noise.as_dict() == {"top10s": 2, "duplicates": 1, "side_channels": 1,
                               "recall_traffic": 1, "top10s_with_noise": 1}


def test_held_out_part_and_projects_are_fixed() -> None:
    ids = [f"session-{i}" for i in range(30)]
    projects = coding_data.assign_projects(ids)
    counts: dict[str, int] = {}
    for project in projects.values():
        counts[project] = counts.get(project, 0) + 1
    assert sorted(counts.values()) == [6] * coding_data.PROJECTS
    assert projects == coding_data.assign_projects(list(reversed(ids)))
    if (SHARED / "coding_eval.json").is_file():
        sets = coding_data.load(SHARED / "coding_eval.json", None)
        assert {s.session_id for s in sets.sessions
                if coding_data.held_out(s.session_id)} == HELD_OUT_SESSIONS


@pytest.mark.skipif(not (SHARED / "natural_questions.json").is_file(),
                    reason="shared coding-session data not present")
def test_the_naive_baseline_reproduces_the_shared_script() -> None:
    """SOURCES.md's figures of baseline_natural_fts5.py (all 120, scope session):
    hit@10 0.875, exact@10 0.717, kf_all@10 0.500, kf_frac@10 0.603."""
    sets = coding_data.load(SHARED / "coding_eval.json", SHARED / "natural_questions.json")
    tally = Tally()
    for session in sets.sessions:
        index = NaiveIndex(Found(session.session_id, i, text) for i, _, text in
                           session.messages)
        for q in sets.of(NATURAL):
            if q.session_id == session.session_id:
                tally.outcomes.append(outcome(q, index.rank(
                    coding_score.natural_terms(q.question))))
        index.close()
    figures = tally.figures()
    assert figures["n"] == 120
    assert (figures["hit@10"], figures["exact@10"], figures["kf_all@10"],
            figures["kf_frac@10"]) == (0.875, 0.7167, 0.5, 0.603)
