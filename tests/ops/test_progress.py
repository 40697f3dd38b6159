"""Long work shows a progress bar on a terminal (counts and rate) and is quiet piped."""

from __future__ import annotations

import json
from pathlib import Path

from clikit import lore, lore_env, on_terminal
from opskit import REPO

IMPORT_CODEX = REPO / "tests" / "data" / "import_codex"


def backlog(env: dict[str, str]) -> int:
    document = json.loads(lore(env | {"LORE_PORT": "1"}, "status", "--json").stdout)
    return int(document["database"]["embedding_backlog"])


def test_embedding_the_backlog(tmp_path: Path):
    env = lore_env(tmp_path)  # LORE_EMBEDDINGS=false: imported messages get no vector
    assert lore(env, "import", "codex", str(IMPORT_CODEX)).returncode == 0
    waiting = backlog(env)
    assert waiting > 0
    env["LORE_EMBEDDINGS"] = "true"

    piped = lore(env, "data", "embed")

    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == f"Embedded {waiting} messages with all-MiniLM-L6-v2.\n"
    assert "━" not in piped.stderr and "embedding" not in piped.stderr
    assert backlog(env) == 0

    shown = on_terminal(env, "data", "embed", "--all")
    assert "embedding" in shown and f"{waiting}/{waiting}" in shown
    assert shown.rstrip().endswith(f"Embedded {waiting} messages with all-MiniLM-L6-v2.")


def test_embedding_refuses_when_embeddings_are_off(tmp_path: Path):
    result = lore(lore_env(tmp_path), "data", "embed")
    assert result.returncode == 2
    assert result.stderr == ("lore: error: embeddings are off (LORE_EMBEDDINGS=false); set "
                             "LORE_EMBEDDINGS=true to use them\n")


def test_a_bench_draws_bars_on_a_terminal_only(tmp_path: Path):
    args = ("bench", "search", "--messages", "1000", "--queries", "10")
    shown = on_terminal(lore_env(tmp_path), *args)
    assert "insert" in shown and "1000/1000" in shown and "━" in shown

    piped = lore(lore_env(tmp_path), *args, "--json")
    assert piped.returncode == 0 and piped.stderr == ""
    assert json.loads(piped.stdout.splitlines()[-1])["messages"] == 1000


def _locomo_sample(path: Path) -> Path:
    turns = [{"speaker": "Ann" if n % 2 else "Bob", "dia_id": f"D1:{n}",
              "text": f"message {n} about the greyhound Comet"} for n in range(1, 7)]
    path.write_text(json.dumps([{
        "sample_id": "conv-p1",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bob",
                         "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns},
        "qa": [{"question": "What is the greyhound called?", "answer": "Comet",
                "evidence": ["D1:1"], "category": 4}],
    }]))
    return path


def test_locomo_shows_its_embedding_stage(tmp_path: Path):
    data = _locomo_sample(tmp_path / "sample.json")
    env = lore_env(tmp_path, LORE_EMBEDDINGS="true")

    shown = on_terminal(env, "bench", "locomo", "--data", str(data))
    assert "embedding" in shown and "6/6" in shown, shown

    piped = lore(env, "bench", "locomo", "--data", str(data), "--json")
    assert piped.returncode == 0 and "embedding" not in piped.stderr
    assert json.loads(piped.stdout.splitlines()[-1])["messages"] == 6
