"""Real Claude Code and compaction through the gateway (issue 13).

``claude -c -p "/compact"`` sends Claude Code's summary fork (the history, the
tools, an appended "CRITICAL: Respond with TEXT ONLY" prompt, the cache marker
left on the message before it). Through the gateway it is answered from memory
and never reaches the provider; the next turn continues from the gateway's
summary, which holds the first turn's fact, and recall still finds it. The
fake reports 300K input tokens per answer, yet Claude Code is shown at most
the cap (150,300 for its 200K window).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_cli import CLAUDE_BIN, agent_binary, base_env, run

from lore_gateway.compaction.detect import CLAUDE_SUMMARY_PREAMBLE
from lore_gateway.compaction.summary import SUMMARY_HEADING
from lore_gateway.compaction.usage import claude_cap
from lore_gateway.context.planner import PREFIX_HEAD
from lore_gateway.testing import FakeUpstream, wait_until_stored

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.clients

FACT = "The billing service deploys from the tangerine branch."
QUERY = "billing service deploy branch"
LARGE_USAGE = 300_000
# The first line of the context layers' distilled prefix (as it reads in JSON).
MANAGED = PREFIX_HEAD.splitlines()[0].encode()
BIG_FILE_BYTES = 40_000


def claude(binary: Path, tmp: Path, base_url: str, prompt: str, *, resume: bool,
           extra: dict[str, str] | None = None, json_output: bool = False) -> Any:
    home, work = tmp / "home", tmp / "work"
    for folder in (home, work):
        folder.mkdir(parents=True, exist_ok=True)
    env = base_env(home) | {
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-ant-test-compact-0123456789",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
    } | (extra or {})
    argv = [str(binary), "-p", prompt, *(["-c"] if resume else []),
            *(["--output-format", "json"] if json_output else [])]
    return run(argv, env, work)


def summary_requests(fake: FakeUpstream) -> list[Any]:
    found = []
    for record in fake.model_requests:
        messages = record.json.get("messages") if isinstance(record.json, dict) else None
        if isinstance(messages, list) and messages and CLAUDE_SUMMARY_PREAMBLE in json.dumps(
                messages[-1]):
            found.append(record)
    return found




def session_with_big_reads(binary: Path, tmp: Path, url: str, fake: FakeUpstream) -> Any:
    """Turn 1 states the fact; turn 2 reads two real 40 KB files with Read while
    the fake reports 300K tokens per answer. Returns turn 2's JSON result."""
    work = tmp / "work"
    work.mkdir(parents=True, exist_ok=True)
    for i in (1, 2):
        line = f"notes{i}: build log line with some detail about module {i}\n"
        (work / f"notes{i}.txt").write_text(line * (BIG_FILE_BYTES // len(line)))
    first = claude(binary, tmp, url, f"Remember this: {FACT}", resume=False)
    assert first.returncode == 0, first.stderr[-3000:]
    fake.reported_input_tokens = LARGE_USAGE
    reads = [json.dumps({"file_path": str(work / f"notes{i}.txt")}) for i in (1, 2)]
    fake.script([f"tool:Read {args}" for args in reads] + ["text"])
    second = claude(binary, tmp, url, "Read both notes files.", resume=True, json_output=True)
    assert second.returncode == 0, second.stderr[-3000:]
    return json.loads(second.stdout)


def test_claude_code_compact_is_answered_from_memory_and_the_session_goes_on(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw = make_gateway()
    result = session_with_big_reads(binary, tmp_path, gw.url, fake_upstream)
    # Claude Code was shown the cap, not the 300K the provider reported.
    usage = result["usage"]
    last_total = sum(int(usage.get(k) or 0) for k in (
        "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    assert 0 < last_total <= claude_cap(200_000, None) * 3 < LARGE_USAGE * 3
    bodies = b"".join(r.body for r in fake_upstream.model_requests)
    assert bodies.count(b"notes2: build log line") > 100
    wait_until_stored(gw, FACT)

    fake_upstream.reset()
    compact = claude(binary, tmp_path, gw.url, "/compact", resume=True)
    assert compact.returncode == 0, compact.stderr[-3000:]
    assert "Not enough messages" not in compact.stdout
    assert summary_requests(fake_upstream) == []  # answered by the gateway
    assert not [r for r in fake_upstream.model_requests if r.route == "/v1/messages"]

    after = claude(binary, tmp_path, gw.url, "Which branch does billing deploy from?",
                   resume=True, extra={"ANTHROPIC_CUSTOM_HEADERS":
                                       f"x-fake-scenario: recall:{QUERY}"})
    assert after.returncode == 0, after.stderr[-3000:]
    assert FACT in after.stdout, after.stdout
    opening = next(r for r in fake_upstream.model_requests if r.route == "/v1/messages")
    # The continued session starts from the gateway's summary or (the context
    # layers managing it: 300K reported) from its distilled prefix; the first
    # turn's fact came back through recall either way (above).
    assert any(mark in opening.body for mark in (SUMMARY_HEADING.encode(), MANAGED))


def overflowing_session(binary: Path, tmp: Path, url: str, fake: FakeUpstream) -> Any:
    """Two turns (the fact, a tool call), then a third the provider refuses as
    too long for the window: Claude Code's own reactive compaction."""
    first = claude(binary, tmp, url, f"Remember this: {FACT}", resume=False)
    assert first.returncode == 0, first.stderr[-3000:]
    fake.script(['tool:Bash {"command":"echo one"}', "text"])
    second = claude(binary, tmp, url, "Run echo one.", resume=True)
    assert second.returncode == 0, second.stderr[-3000:]
    fake.reset()
    fake.script(["too-long", "text", "text", "text"])
    third = claude(binary, tmp, url, "Go on.", resume=True)
    assert third.returncode == 0, third.stderr[-3000:]
    return third


def test_claude_code_compacts_on_a_context_overflow_without_the_gateway(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    overflowing_session(binary, tmp_path, fake_upstream.url, fake_upstream)
    assert summary_requests(fake_upstream), "Claude Code did not compact on the overflow"


def test_claude_code_never_compacts_on_an_overflow_through_the_gateway(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    """The gateway retries the overflowing request at a higher context layer
    itself (docs/context.md), so Claude Code never sees the overflow nor compacts."""
    binary = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw = make_gateway()
    overflowing_session(binary, tmp_path, gw.url, fake_upstream)
    assert summary_requests(fake_upstream) == []
    retried = [r for r in fake_upstream.model_requests if r.route == "/v1/messages"][-1]
    assert MANAGED in retried.body
