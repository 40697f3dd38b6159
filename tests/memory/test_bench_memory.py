"""``lore bench locomo`` / ``lore bench search`` on small inputs, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.bench import locomo
from lore_gateway.cli.main import _register, app

REAL_DEV = Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo10_dev.json"


def _sample(tmp_path: Path) -> Path:
    """Two LoCoMo-shaped conversations, with the documented evidence quirks."""
    conv = {
        "sample_id": "conv-t1",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a greyhound named Comet."},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely! I started pottery class."},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "Look at this",
                 "blip_caption": "a photo of a lighthouse at dusk"},
            ],
            "session_2_date_time": "9:00 am on 20 May, 2023",
            "session_2": [
                {"speaker": "Bob", "dia_id": "D2:1", "text": "My kiln broke during firing."},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "Comet ran a race in Leeds."},
            ],
            # conv-26-style stray date key with no session: must be ignored.
            "session_9_date_time": "1:00 pm on 1 June, 2023",
        },
        "qa": [
            {"question": "What is the name of Ann's greyhound?", "answer": "Comet",
             "evidence": ["D1:1"], "category": 4},
            {"question": "What did Bob's kiln do?", "answer": "broke",
             "evidence": ["D2:01"], "category": 2},
            {"question": "Where did the greyhound race?", "answer": "Leeds",
             "evidence": ["D1:1; D2:2"], "category": 1},
            {"question": "What did Ann photograph?", "answer": "a lighthouse",
             "evidence": ["D:1:3"], "category": 3},
            {"question": "Did Bob adopt a dog?", "adversarial_answer": "yes",
             "evidence": ["D1:1"], "category": 5},
            {"question": "Unanswerable", "answer": "x", "evidence": ["D", "D7:1"],
             "category": 4},
        ],
    }
    path = tmp_path / "locomo_sample.json"
    path.write_text(json.dumps([conv]))
    return path


def test_evidence_cleaning_follows_sources_md() -> None:
    valid = {"D8:6", "D9:17", "D9:1", "D4:4", "D4:6", "D11:26", "D30:5"}
    assert locomo.clean_evidence(["D8:6; D9:17"], valid) == ("D8:6", "D9:17")
    assert locomo.clean_evidence(["D9:1 D4:4 D4:6"], valid) == ("D9:1", "D4:4", "D4:6")
    assert locomo.clean_evidence(["D:11:26", "D30:05"], valid) == ("D11:26", "D30:5")
    assert locomo.clean_evidence(["D", "D10:19"], valid) == ()


@pytest.mark.usefixtures("database_url")
def test_locomo_cli_json_on_sample(tmp_path: Path) -> None:
    _register()
    out = CliRunner().invoke(app, ["bench", "locomo", "--data", str(_sample(tmp_path)),
                                   "--no-embeddings", "--json"])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output.strip().splitlines()[-1])
    assert set(figures["categories"]) == {"1", "2", "3", "4", "5"}
    # The question without valid evidence is skipped: 5 scored, 4 of them in 1–4.
    assert figures["all"]["n"] == 5 and figures["cats_1_4"]["n"] == 4
    # The held-out rule puts a conversation wholly on one side.
    assert sorted((figures["tuning_1_4"]["n"], figures["held_out_1_4"]["n"])) == [0, 4]
    # Single-hop: the greyhound's name is in D1:1 and is ranked first.
    assert figures["categories"]["4"] == {"recall@5": 1.0, "recall@10": 1.0, "mrr": 1.0, "n": 1}
    # The caption is part of the stored text, so the photo question finds D1:3.
    assert figures["categories"]["3"]["recall@10"] == 1.0
    assert figures["messages"] == 5
    assert figures["median_query_ms"] > 0


def test_locomo_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    _register()
    out = CliRunner().invoke(app, ["bench", "locomo", "--data", str(tmp_path / "nope.json")])
    assert out.exit_code == 2
    assert "LoCoMo data not found" in out.output


@pytest.mark.skipif(not REAL_DEV.is_file(), reason="shared LoCoMo dev data not present")
@pytest.mark.usefixtures("database_url")
def test_two_real_conversations_bm25_beats_floor() -> None:
    report = locomo.run(REAL_DEV, embeddings=False, limit_conversations=2)
    figures = report.as_dict()
    # BM25 with context alone: recall@10 is ~0.69 on the whole dev half; this is a floor
    # that catches a broken ranking, not a tuning target.
    assert figures["cats_1_4"]["recall@10"] > 0.55
    assert figures["cats_1_4"]["mrr"] > 0.38


@pytest.mark.sqlite_only  # `lore bench search` builds a SQLite store (--backend: pgops)
def test_search_bench_small_corpus() -> None:
    _register()
    out = CliRunner().invoke(app, ["bench", "search", "--messages", "2000", "--queries", "10",
                                   "--json"])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output.strip().splitlines()[-1])
    assert figures["messages"] == 2000
    assert figures["insert_msgs_per_s"] > 0 and figures["db_mb"] > 0
    assert figures["bm25_project"]["n"] == 10 and figures["bm25_all"]["p50_ms"] > 0
