"""Real Codex CLI (``codex exec``) past its own auto-compaction threshold (issue 13).

The fake upstream reports 300K input tokens per answer (Codex compacts at 90 % of
its 272K fallback window, 244,800), and the session reads two real files of
40 KB through ``exec_command``. Straight to the fake, Codex compacts; through
the gateway it is shown scaled usage and never asks. Forced compactions (a
``model_auto_compact_token_limit`` of 1,000) in both of Codex's flows, local
(a provider not named OpenAI, as ``lore run`` sets up) and remote v2
(``compaction_trigger``), are answered from memory and the next turn continues
with the gateway's summary. The first turn's fact is recalled at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recall"))
from agent_cli import (
    CODEX_BIN,
    agent_binary,
    chatgpt_auth_json,
    codex_apikey_config,
    codex_chatgpt_config,
    codex_exec,
)
from test_codex_recall import resume_last, with_recall_header

from lore_gateway.compaction.answers import HANDLE_PREFIX
from lore_gateway.compaction.summary import SUMMARY_HEADING
from lore_gateway.compaction.usage import codex_cap
from lore_gateway.testing import FakeUpstream, wait_until_stored

pytestmark = pytest.mark.clients

API_KEY = "sk-test-codex-compaction-0123456789"
FACT = "The billing service deploys from the tangerine branch."
LARGE_USAGE = 300_000
BIG_FILE_BYTES = 40_000
READS = [f'tool:exec_command {{"cmd":"cat notes{i}.txt"}}' for i in (1, 2)]


def request_kind(record: Any) -> str | None:
    raw = record.headers.get("x-codex-turn-metadata")
    return json.loads(raw).get("request_kind") if raw else None


def compaction_requests(fake: FakeUpstream) -> list[Any]:
    """What the fake saw of Codex compacting: local, remote v2 or v1."""
    found = []
    for record in fake.model_requests:
        items = record.json.get("input") if isinstance(record.json, dict) else None
        last = items[-1] if isinstance(items, list) and items else {}
        if (request_kind(record) == "compaction" or record.route.endswith("/compact")
                or (isinstance(last, dict) and last.get("type") == "compaction_trigger")):
            found.append(record)
    return found


def big_files(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for i in (1, 2):
        line = f"notes{i}: build log line with some detail about module {i}\n"
        (work / f"notes{i}.txt").write_text(line * (BIG_FILE_BYTES // len(line)))




def long_session(codex: Path, tmp: Path, config: str, fake: FakeUpstream,
                 auth_json: str | None = None) -> Any:
    """Turn 1 states the fact; turn 2 reads two big files while the fake reports
    300K tokens per answer. Returns the second run."""
    big_files(tmp / "work")
    first = codex_exec(codex, tmp, config, f"Remember this: {FACT}",
                       extra_env={"FAKE_API_KEY": API_KEY}, auth_json=auth_json)
    assert first.returncode == 0, first.stderr[-3000:]
    fake.reset()
    fake.reported_input_tokens = LARGE_USAGE
    fake.script([*READS, "text", "text", "text"])
    second = resume_last(codex, tmp, config, "Read both notes files.", {"FAKE_API_KEY": API_KEY})
    assert second.returncode == 0, second.stderr[-3000:]
    return second


def test_codex_compacts_on_its_own_without_the_gateway(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    long_session(codex, tmp_path, codex_apikey_config(fake_upstream.url), fake_upstream)
    assert compaction_requests(fake_upstream), "Codex did not compact past its threshold"


@pytest.mark.parametrize("mode", ["apikey", "chatgpt"])
def test_codex_never_compacts_through_the_gateway_and_keeps_the_first_fact(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, mode: str) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    gw = make_gateway()
    auth_json = None
    if mode == "apikey":
        config = codex_apikey_config(gw.url)
    else:  # the ChatGPT login: the Codex backend's path through the gateway
        auth_json, _ = chatgpt_auth_json()
        config = codex_chatgpt_config(gw.url, fake_upstream.url + "/backend-api/")
    second = long_session(codex, tmp_path, config, fake_upstream, auth_json)
    route = "/v1/responses" if mode == "apikey" else "/backend-api/codex/responses"
    assert {r.route for r in fake_upstream.model_requests} == {route}
    assert compaction_requests(fake_upstream) == []
    # The big files really went upstream, and Codex was shown the capped usage.
    bodies = b"".join(r.body for r in fake_upstream.model_requests)
    assert bodies.count(b"notes2: build log line") > 100
    # "tokens used" sums the session's answers (turn 1's few tokens included):
    # each of this turn's was shown at most the cap.
    answers = len(fake_upstream.model_requests)
    shown = int(second.stderr.split("tokens used")[-1].split()[0].replace(",", ""))
    assert answers >= 3
    assert shown <= (codex_cap(272_000) + 100) * answers < LARGE_USAGE * answers
    wait_until_stored(gw, FACT)

    fake_upstream.reset()
    fake_upstream.reported_input_tokens = LARGE_USAGE
    third = resume_last(codex, tmp_path, with_recall_header(config),
                        "Which branch does billing deploy from?", {"FAKE_API_KEY": API_KEY})
    assert third.returncode == 0, third.stderr[-3000:]
    assert FACT in third.stdout, third.stdout
    assert compaction_requests(fake_upstream) == []


@pytest.mark.parametrize("flow", ["local", "remote_v2"])
def test_codex_forced_compaction_is_answered_from_memory(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, flow: str) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    gw = make_gateway()
    config = codex_apikey_config(gw.url)
    first = codex_exec(codex, tmp_path, config, f"Remember this: {FACT}",
                       extra_env={"FAKE_API_KEY": API_KEY})
    assert first.returncode == 0, first.stderr[-3000:]
    wait_until_stored(gw, FACT)

    forced = config.replace('model_provider = "gwkey"',
                            'model_provider = "gwkey"\nmodel_auto_compact_token_limit = 1000')
    if flow == "remote_v2":  # Codex compacts remotely for a provider named OpenAI
        forced = forced.replace('name = "lore gateway (API key)"', 'name = "OpenAI"')
    fake_upstream.reset()
    fake_upstream.reported_input_tokens = 5_000
    fake_upstream.script([READS[0], "text", "text", "text"])
    second = resume_last(codex, tmp_path, forced, "Read the first notes file.",
                         {"FAKE_API_KEY": API_KEY})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "context compacted" in second.stderr.lower(), second.stderr[-3000:]
    assert compaction_requests(fake_upstream) == []  # answered by the gateway
    # The turn went on from the gateway's summary, which holds the first turn.
    after = fake_upstream.model_requests[-1].body
    assert SUMMARY_HEADING.encode() in after
    assert FACT.encode() in after
    assert HANDLE_PREFIX.encode() not in after  # our handle never goes upstream
