"""``lore bench context`` on a small synthetic set: the figures a user reads."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner


def session(n: int) -> dict[str, object]:
    messages: list[dict[str, object]] = [
        {"index": 0, "role": "user", "content": f"Task {n}: fix the failing handler test."}]
    for i in range(40):
        messages.append({"index": len(messages), "role": "assistant",
                         "content": f"THOUGHT: look.\n```bash\ngrep -rn handler_{n}_{i} src\n```"})
        messages.append({"index": len(messages), "role": "tool", "content": "".join(
            f"src/pkg_{n}/mod_{i}.py:{j}: def handler_{n}_{i}_{j}(): pass\n" for j in range(25))})
    return {"session_id": f"s{n}", "messages": messages}


def test_bench_context_reports_savings_peak_stability_and_early_facts(tmp_path: Path) -> None:
    from lore_gateway.cli.main import _register, app

    _register()
    questions = [{"session_id": "s0", "kind": "definition_location",
                  "question": "Where is handler_0_3_7 defined?",
                  "evidence": "src/pkg_0/mod_3.py:7: def handler_0_3_7(): pass"}]
    data = tmp_path / "coding_eval.json"
    data.write_text(json.dumps({"sessions": [session(n) for n in range(4)],
                                "questions": questions}))
    result = CliRunner().invoke(app, ["bench", "context", "--data", str(data), "--window",
                                      "12000", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["turns"] == 4 * 41
    assert figures["session_tokens"] > 3 * figures["window"]
    assert figures["upstream_vs_passthrough"] < 0.65
    assert figures["peak_share_of_window"] <= 0.75
    assert figures["extends_previous_share"] > 0.9
    assert figures["rewrites"].get("budget/prefix kept", 0) >= 1
    assert figures["prefix_rerenders"] == 1  # once, the first time; then only the tail moves
    assert figures["early_facts"] == {"questions": 1, "in_context": 0, "via_recall": 1,
                                      "answerable": 1, "share": 1.0}
    assert "upstream input tokens / passthrough" in result.output
