"""``lore bench retention``: key facts kept by the logs, the compaction answers and
one recall, against same-size baselines, on small samples through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from lore_gateway.bench import retention_score as score
from lore_gateway.cli.main import _register, app

EARLY_ERROR = "KeyError: 'tangerine_wheel'"
LATE_RESULT = "41 passed, 2 skipped in 3.10s"


def _session(sid: str) -> dict[str, Any]:
    contents: list[tuple[str, str]] = [
        ("user", f"Fix the crash in {sid} when the wheel config is missing."),
        ("assistant", "THOUGHT: reproduce it first.\n```bash\npython repro.py\n```"),
        ("tool", f"Traceback (most recent call last):\n  File \"repro.py\", line 3, in <module>"
                 f"\n    load()\n{EARLY_ERROR}"),
        ("assistant", "THOUGHT: The root cause is the missing default in `load_config`."),
    ]
    for i in range(60):  # a long middle: file views that no question asks about
        contents += [("assistant", f"THOUGHT: look at part {i}.\n```bash\nsed -n '{i},"
                                   f"{i + 40}p' src/{sid}/mod_{i}.py\n```"),
                     ("tool", "\n".join(f"    x_{i}_{j} = compute({j})" for j in range(40)))]
    contents += [("assistant", "THOUGHT: run the suite.\n```bash\npytest -q\n```"),
                 ("tool", f"........\n{LATE_RESULT}")]
    return {"session_id": sid, "source": {}, "messages": [
        {"index": i, "role": role, "content": text} for i, (role, text) in enumerate(contents)]}


def _sample(tmp_path: Path) -> tuple[Path, Path]:
    sessions = [_session("s-gear"), _session("s-cog")]
    last = len(sessions[0]["messages"]) - 1
    questions = [{"kind": "test_summary", "session_id": sid, "message_index": last,
                  "question": "What did the final test run report?", "answer": "",
                  "evidence": LATE_RESULT, "gold_indices": [last]}
                 for sid in ("s-gear", "s-cog")]
    data = tmp_path / "coding_eval.json"
    data.write_text(json.dumps({"sessions": sessions, "questions": questions}))
    (tmp_path / "natural_questions.json").write_text(json.dumps({"questions": [
        {"id": "nq-s-gear-1", "session_id": "s-gear", "kind": "error", "position": "early",
         "question": "What went wrong when I first reproduced the wheel crash?", "answer": "",
         "message_index": 2, "gold_indices": [2], "key_facts": [EARLY_ERROR]}]}))
    turns = [{"speaker": "Ann" if i % 2 == 0 else "Bo", "dia_id": f"D1:{i + 1}",
              "text": f"Small talk number {i} about the weather."} for i in range(40)]
    turns[3]["text"] = "I adopted a greyhound named Biscuit Wellington last spring."
    locomo = tmp_path / "locomo.json"
    locomo.write_text(json.dumps([{
        "sample_id": "conv-1", "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bo", "session_1": turns,
            "session_1_date_time": "1:56 pm on 8 May, 2023"},
        "qa": [{"question": "What is the name of Bo's dog?", "answer": "Biscuit Wellington",
                "evidence": ["D1:4"], "category": 1}]}]))
    return data, locomo


def _run(*args: str) -> dict[str, Any]:
    _register()
    out = CliRunner().invoke(app, ["bench", "retention", *args, "--no-embeddings", "--json"])
    assert out.exit_code == 0, out.output
    figures: dict[str, Any] = json.loads(out.output.strip().splitlines()[-1])
    return figures


def test_every_text_is_scored_against_same_size_baselines(tmp_path: Path) -> None:
    data, locomo = _sample(tmp_path)
    figures = _run("--data", str(data), "--locomo", str(locomo), "--segments", "2048,256")
    assert set(figures["regimes"]) == {"segments_2048", "segments_256"}
    # Small segments make many logs, so consolidation runs (two coding sessions).
    assert figures["consolidated_sessions"]["segments_256"] >= 2
    measures = figures["regimes"]["segments_2048"]
    assert {"first_level", "distillations", "compaction_claude", "compaction_codex",
            "after_recall"} <= set(measures)
    assert set(measures["compaction_claude"]) == {"coding", "natural", "rule", "locomo"}
    answer = measures["compaction_claude"]["coding"]["all"]
    assert set(answer) == {"lore", "last", "first_last", "closing"}
    # Same size: every baseline has the answer's compression.
    assert {t["compression"] for t in answer.values()} == {answer["lore"]["compression"]}
    assert answer["lore"]["compression"] >= 10
    # The early error survives in the answer; the newest characters of the same size
    # do not hold it.
    early = measures["compaction_claude"]["natural"]["position:early"]
    assert early["lore"]["kept"] == 1.0 and early["last"]["kept"] == 0.0
    # Claude Code's and Codex's answers carry the same text.
    assert measures["compaction_codex"]["coding"]["all"]["lore"] == answer["lore"]
    # One recall brings back what the answer left out.
    assert measures["after_recall"]["coding"]["all"]["lore"]["complete"] == 1.0
    assert figures["sessions"] == 3


def test_a_reused_store_gives_the_same_figures(tmp_path: Path) -> None:
    data, locomo = _sample(tmp_path)
    args = ("--data", str(data), "--locomo", str(locomo), "--segments", "512",
            "--store", str(tmp_path / "store"))
    first, again = _run(*args), _run(*args)
    assert not first["store_reused"] and again["store_reused"]
    assert first["regimes"] == again["regimes"]


def test_facts_are_found_across_whitespace_and_baselines_cut_to_size() -> None:
    assert score.kept(["a  b\nc", "zz"], "x a b c y") == [True, False]
    messages = [("user", "first request"), ("assistant", "THOUGHT: x\n```bash\nls\n```"),
                ("tool", "out"), ("assistant", "Done: fixed in src/a.py."),
                ("user", "second request"), ("assistant", "All set.")]
    closing = score.closing(messages, 1_000)
    assert closing.splitlines() == [
        "user: first request", "assistant: Done: fixed in src/a.py.", "user: second request",
        "assistant: All set."]
    text = "0123456789" * 10
    cut = score.first_last([("user", text)], 21)
    assert len(cut) == 21 and cut.startswith("user: 0123") and cut.endswith("789")
    assert score.last([("user", text)], 5) == "56789"
