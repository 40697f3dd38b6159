"""Real Claude Code and real Codex CLI, two sessions in one project (issue 12).

Offline against the fake provider, which also plays the worker model: a
decision stated in the first session is distilled and curated in the
background, reaches the knowledge block of the second session's first coding
request, and is written to ``.lore.md`` in the project's work tree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.knowledge import export as ex
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.knowledge.sidechannel import is_coding_turn
from lore_gateway.testing import FakeUpstream, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cli import (
    CLAUDE_BIN,
    CODEX_BIN,
    agent_binary,
    base_env,
    chatgpt_auth_json,
    claude_print,
    codex_apikey_config,
    codex_chatgpt_config,
    codex_exec,
    run,
)
from kit import git_project, worker_requests

pytestmark = pytest.mark.clients

DECISION = "Decision: the billing service deploys from the tangerine branch. Main is frozen."
FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600}
CURATE_WAIT_S = 60.0


def decision_entries(gw: Any) -> list[kstore.Entry]:
    rows = gw.memory.read(lambda c: kstore.entries(c, None, None))
    return [e for e in rows if e.category == "decision" and "tangerine" in e.content]


def first_coding_request(fake: FakeUpstream, family: str) -> Any:
    for record in fake.model_requests:
        if "x-lore-worker" not in record.headers and isinstance(record.json, dict) and \
                is_coding_turn(family, record.json, record.headers):
            return record
    raise AssertionError("no coding request reached the upstream")


def test_claude_code_second_session_starts_with_the_first_sessions_decision(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    project = git_project(tmp_path / "work")
    gw = make_gateway(**FAST)
    env = {"ANTHROPIC_API_KEY": "sk-ant-test-knowledge-0123456789"}
    first = claude_print(claude, tmp_path, gw.url, DECISION, extra_env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    wait_until(lambda: decision_entries(gw), "the curated decision")
    assert {r.headers["x-lore-worker"] for r in worker_requests(fake_upstream)} == {
        "distill", "curate"}
    # The export writes .lore.md, then the pointer in CLAUDE.md: wait for both.
    wait_until(lambda: (project / ".lore.md").exists() and (project / "CLAUDE.md").exists(),
               "the export")
    assert "tangerine branch" in (project / ".lore.md").read_text()
    assert ex.POINTER_BEGIN in (project / "CLAUDE.md").read_text()

    fake_upstream.reset()
    second = claude_print(claude, tmp_path, gw.url, "Which branch does billing deploy from?",
                          extra_env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    opening = first_coding_request(fake_upstream, "anthropic")
    system = opening.json["system"]
    assert system[-1]["type"] == "text" and BLOCK_HEADING in system[-1]["text"]
    assert "tangerine branch" in system[-1]["text"]
    assert "cache_control" not in system[-1]

    # The next turn of that session (claude -c): the same frozen block, byte for
    # byte (Claude Code itself rewrites parts of its own system prompt per run).
    fake_upstream.reset()
    third = run([str(claude), "-c", "-p", "thanks"], base_env(tmp_path / "home") | env | {
        "ANTHROPIC_BASE_URL": gw.url, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1"},
        project)
    assert third.returncode == 0, third.stderr[-3000:]
    later = first_coding_request(fake_upstream, "anthropic")
    assert later.json["system"][-1] == system[-1]
    assert later.body.count(BLOCK_HEADING.encode()) == 1


@pytest.mark.parametrize("mode", ["apikey", "chatgpt"])
def test_codex_second_session_starts_with_the_first_sessions_decision(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, mode: str) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    project = git_project(tmp_path / "work")
    gw = make_gateway(**FAST)
    env: dict[str, str] = {}
    auth_json: str | None = None
    if mode == "apikey":
        config = codex_apikey_config(gw.url)
        env = {"FAKE_API_KEY": "sk-test-codex-knowledge-0123456789"}
        route = "/v1/responses"
    else:
        auth_json, _ = chatgpt_auth_json()
        config = codex_chatgpt_config(gw.url, fake_upstream.url + "/backend-api/")
        route = "/backend-api/codex/responses"
    first = codex_exec(codex, tmp_path, config, DECISION, extra_env=env, auth_json=auth_json)
    assert first.returncode == 0, first.stderr[-3000:]
    # Two background model calls behind the CLI's exit: on a loaded 2-core machine
    # (the suite runs the CLIs and Postgres beside it) they took over 20 s once.
    wait_until(lambda: decision_entries(gw), "the curated decision", CURATE_WAIT_S)
    workers = worker_requests(fake_upstream)
    assert workers and all(w.route == route for w in workers)
    if mode == "chatgpt":
        assert all(w.json["stream"] is True and "max_output_tokens" not in w.json
                   for w in workers)
    # The export writes .lore.md, then the pointer in AGENTS.md: wait for both.
    wait_until(lambda: (project / ".lore.md").exists() and (project / "AGENTS.md").exists(),
               "the export")
    assert "tangerine branch" in (project / ".lore.md").read_text()
    assert ex.POINTER_BEGIN in (project / "AGENTS.md").read_text()

    fake_upstream.reset()
    second = codex_exec(codex, tmp_path, config, "Which branch does billing deploy from?",
                        extra_env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    opening = first_coding_request(fake_upstream, "responses")
    texts = [part.get("text", "") for item in opening.json["input"]
             if item.get("role") == "developer" for part in item.get("content", [])]
    block = [t for t in texts if BLOCK_HEADING in t]
    assert block and "tangerine branch" in block[0]

    # The next turn of that session (exec resume --last): the same items first.
    fake_upstream.reset()
    codex_home = tmp_path / "codexhome"
    resumed = run([str(codex), "exec", "--skip-git-repo-check", "resume", "--last", "thanks"],
                  base_env(tmp_path / "home") | {"CODEX_HOME": str(codex_home)} | env, project)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    later = first_coding_request(fake_upstream, "responses")
    first_items = opening.json["input"]
    assert later.json["input"][:len(first_items)] == first_items
