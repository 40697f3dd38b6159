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
    assert figures["per_session"] == {"s0": {"n": 1, "survived": 1},
                                      "s1": {"n": 1, "survived": 0}}
    assert figures["sessions_all_kept"] == 1
    assert figures["compression"] > 1
    assert 0 < figures["worker_share_of_prompts"] < figures["worker_share_of_raw"]
    assert "gold answers kept" in result.output


def test_bench_distill_worker_arm_against_the_fake_provider(
        tmp_path: Path, fake_upstream: object, monkeypatch: object) -> None:
    """The worker arm sends each segment as the gateway's worker would (here to the
    fake, which plays the worker model) and reports the tokens it really used."""
    from lore_gateway.cli.main import _register, app

    _register()
    sessions = [{"session_id": "s0", "messages": [
        {"index": 0, "role": "user", "content": "Use the slug field from app/models.py"},
        {"index": 1, "role": "assistant", "content": "ok " * 300}]}]
    data = tmp_path / "coding_eval.json"
    data.write_text(json.dumps({"sessions": sessions, "questions": [
        {"session_id": "s0", "kind": "edited_file", "answer": "app/models.py"}]}))
    url = fake_upstream.url + "/v1/messages"  # type: ignore[attr-defined]
    result = CliRunner(env={"BENCH_KEY": "sk-ant-test-bench"}).invoke(app, [
        "bench", "distill", "--data", str(data), "--worker", "anthropic", "--key-env",
        "BENCH_KEY", "--worker-url", url, "--json"])
    assert result.exit_code == 0, result.output
    extractive, worker = json.loads(result.output.strip().splitlines()[-1])["arms"]
    assert worker["method"] == "worker claude-haiku-4-5" and worker["segments"] == 1
    assert worker["gold_survived"] == 1 and worker["worker_tokens"] > 0
    (sent,) = fake_upstream.model_requests  # type: ignore[attr-defined]
    assert sent.headers["x-lore-worker"] == "distill"
    assert sent.headers["x-api-key"] == "sk-ant-test-bench"
    assert extractive["method"] == "extractive"
