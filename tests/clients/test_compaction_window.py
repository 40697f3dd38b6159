"""Real Codex CLI and Claude Code, metered by real bytes, past their own limits
(issue 13 acceptance, with the context layers of docs/context.md).

The fake upstream meters every request (bytes / 4 tokens, ``metered``) against a
small window (60K tokens), so a session of real 40 KB file reads passes it in a
few turns without megabytes of traffic (30K for Codex, which keeps only ~10 KB
of each command's output):

* Codex is told its window is 30K (``model_context_window``): straight to the
  fake it compacts past 90 % of it; through the gateway every upstream request
  stays within 0.75 of the window and Codex never asks.
* Claude Code compacts when the provider refuses a prompt as too long: straight
  to the fake it does; through the gateway no request overflows and it never asks.

Both end by recalling a fact from the session's first turn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recall"))
from agent_cli import CLAUDE_BIN, CODEX_BIN, agent_binary, codex_apikey_config, codex_exec
from test_codex_recall import resume_last, with_recall_header
from test_compaction_claude_code import QUERY, claude, summary_requests
from test_compaction_codex import compaction_requests

from lore_gateway.testing import FakeUpstream, wait_until_stored

pytestmark = pytest.mark.clients

FACT = "The billing service deploys from the tangerine branch."
WINDOW = 60_000
# Codex keeps ~10 KB of a command's output, so its session gets a smaller window.
CODEX_WINDOW = 30_000
READ_BYTES = 36_000
READS = 10
API_KEY = "sk-test-codex-window-0123456789"


def notes(work: Path) -> list[Path]:
    work.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(READS):
        line = f"notes{i}: build log line with some detail about module {i}\n"
        path = work / f"notes{i}.txt"
        path.write_text(line * (READ_BYTES // len(line)))
        files.append(path)
    return files


def metered(fake: FakeUpstream, window: int = WINDOW) -> None:
    fake.metered = True
    fake.window = window


def peak_share(fake: FakeUpstream, window: int = WINDOW) -> float:
    return max(tokens for tokens, _ in fake.metered_log) / window


def codex_config(url: str) -> str:
    return codex_apikey_config(url).replace(
        'model_provider = "gwkey"',
        f'model_provider = "gwkey"\nmodel_context_window = {CODEX_WINDOW}')


def codex_session(codex: Path, tmp: Path, config: str, fake: FakeUpstream) -> None:
    notes(tmp / "work")
    metered(fake, CODEX_WINDOW)
    first = codex_exec(codex, tmp, config, f"Remember this: {FACT}",
                       extra_env={"FAKE_API_KEY": API_KEY})
    assert first.returncode == 0, first.stderr[-3000:]
    fake.script([f'tool:exec_command {{"cmd":"cat notes{i}.txt"}}' for i in range(READS)]
                + ["text"] * 4)
    second = resume_last(codex, tmp, config, "Read every notes file.", {"FAKE_API_KEY": API_KEY})
    assert second.returncode == 0, second.stderr[-3000:]


def test_codex_past_its_window_compacts_alone(fake_upstream: FakeUpstream,
                                              tmp_path: Path) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    config = codex_config(fake_upstream.url)
    codex_session(codex, tmp_path, config, fake_upstream)
    assert compaction_requests(fake_upstream), "Codex did not compact past its window"


def test_codex_through_the_gateway_never_compacts_within_the_window(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    gw = make_gateway(context_window=CODEX_WINDOW, codex_window_tokens=CODEX_WINDOW)
    config = codex_config(gw.url)
    codex_session(codex, tmp_path, config, fake_upstream)
    assert compaction_requests(fake_upstream) == []
    assert len(fake_upstream.metered_log) >= READS
    assert peak_share(fake_upstream, CODEX_WINDOW) <= 0.75
    wait_until_stored(gw, FACT)
    third = resume_last(codex, tmp_path, with_recall_header(config),
                        "Which branch does billing deploy from?", {"FAKE_API_KEY": API_KEY})
    assert third.returncode == 0, third.stderr[-3000:]
    assert FACT in third.stdout, third.stdout
    assert compaction_requests(fake_upstream) == []
    assert peak_share(fake_upstream, CODEX_WINDOW) <= 0.75


def claude_session(binary: Path, tmp: Path, url: str, fake: FakeUpstream) -> None:
    files = notes(tmp / "work")
    metered(fake)
    first = claude(binary, tmp, url, f"Remember this: {FACT}", resume=False)
    assert first.returncode == 0, first.stderr[-3000:]
    fake.script([f"tool:Read {json.dumps({'file_path': str(f)})}" for f in files]
                + ["text"] * 4)
    second = claude(binary, tmp, url, "Read every notes file.", resume=True)
    assert second.returncode == 0, second.stderr[-3000:]


def test_claude_code_past_the_window_compacts_alone(fake_upstream: FakeUpstream,
                                                    tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    claude_session(binary, tmp_path, fake_upstream.url, fake_upstream)
    assert summary_requests(fake_upstream), "Claude Code did not compact on the overflow"


def test_claude_code_through_the_gateway_never_compacts_within_the_window(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw = make_gateway(context_window=WINDOW)
    claude_session(binary, tmp_path, gw.url, fake_upstream)
    assert summary_requests(fake_upstream) == []
    assert len(fake_upstream.metered_log) >= READS
    assert peak_share(fake_upstream) <= 0.75
    wait_until_stored(gw, FACT)
    after = claude(binary, tmp_path, gw.url, "Which branch does billing deploy from?",
                   resume=True, extra={"ANTHROPIC_CUSTOM_HEADERS":
                                       f"x-fake-scenario: recall:{QUERY}"})
    assert after.returncode == 0, after.stderr[-3000:]
    assert FACT in after.stdout, after.stdout
    assert summary_requests(fake_upstream) == [] and peak_share(fake_upstream) <= 0.75
