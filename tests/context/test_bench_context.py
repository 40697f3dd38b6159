"""``lore bench context`` on a small synthetic set: the figures a user reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("style", ["claude", "codex"])
def test_bench_context_reports_savings_peak_stability_and_provider_rules(
        tmp_path: Path, style: str) -> None:
    from lore_gateway.cli.main import _register, app

    _register()
    questions = [{"session_id": f"s{n}", "kind": "definition_location",
                  "question": f"Where is handler_{n}_3_7 defined?",
                  "evidence": f"src/pkg_{n}/mod_3.py:7: def handler_{n}_3_7(): pass"}
                 for n in range(4)]
    data = tmp_path / "coding_eval.json"
    data.write_text(json.dumps({"sessions": [session(n) for n in range(4)],
                                "questions": questions}))
    result = CliRunner().invoke(app, ["bench", "context", "--data", str(data), "--window",
                                      "12000", "--style", style, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["style"] == style
    assert figures["turns"] == 4 * 40 + 4  # a reply per round, and one ending each task
    assert figures["session_tokens"] > 3 * figures["window"]
    assert figures["hidden_recalls"] >= 2
    assert figures["upstream_requests"] >= figures["turns"] + figures["hidden_recalls"]
    # What a real provider would have refused, or that reached the agent: nothing.
    assert figures["strict_violations"] == 0, figures["violations_by_rule"]
    assert figures["provider_errors_to_client"] == 0
    assert figures["requests_over_share"]["0.80"] == 0
    assert figures["peak_share_of_window"] <= 0.80
    assert figures["upstream_vs_passthrough"] < 0.65
    assert figures["extends_previous_share"] > 0.9
    assert figures["rewrites"].get("budget/prefix kept", 0) >= 1
    assert figures["early_facts"]["questions"] == 3  # those of the first three sessions
    assert figures["early_facts"]["answerable"] == 3, figures["early_facts"]
    assert "strict-rule violations" in result.output
