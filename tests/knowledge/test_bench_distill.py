"""``lore bench distill`` on a two-session sample: figures a user reads."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner


def test_bench_distill_reports_compression_worker_share_and_gold_survival(
        tmp_path: Path) -> None:
    from lore_gateway.cli.main import _register, app

    _register()
    tool = "Traceback (most recent call last):\n" + "  frame\n" * 400 + "KeyError: 'slug'\n"
    sessions = [{"session_id": f"s{n}", "messages": [
        {"index": 0, "role": "user", "content": "Fix the slug lookup in app/models.py"},
        {"index": 1, "role": "assistant", "content": "Running it.\n```bash\npython run.py\n```"},
        {"index": 2, "role": "tool", "content": tool},
        {"index": 3, "role": "assistant", "content": "filler " * 300}]} for n in range(2)]
    questions = [{"session_id": "s0", "kind": "exception", "answer": "KeyError: 'slug'"},
                 {"session_id": "s1", "kind": "edited_file", "answer": "never/there.py"}]
    data = tmp_path / "coding_eval.json"
    data.write_text(json.dumps({"sessions": sessions, "questions": questions}))
    result = CliRunner().invoke(app, ["bench", "distill", "--data", str(data), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["sessions"] == 2 and figures["questions"] == 2
    assert figures["gold_survived"] == 1 and figures["by_kind"]["exception"]["survived"] == 1
    assert figures["compression"] > 1
    assert 0 < figures["worker_share_of_prompts"] < figures["worker_share_of_raw"]
    assert "gold answers kept" in result.output
