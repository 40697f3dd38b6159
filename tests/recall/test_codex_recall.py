"""The real Codex CLI and hidden recall (issue 4 acceptance).

Three runs of the real ``codex`` binary in one project (same cwd, so the
gateway files them under one project), offline against the fake, in both
provider modes (API key on ``/v1``, ChatGPT login on ``/backend-api/codex``):

1. ``codex exec`` states a fact; the gateway stores the turn.
2. ``codex exec`` asks about it with ``x-fake-scenario: recall:<query>`` on the
   provider, so the fake model calls ``recall``. The gateway runs it, sends the
   follow-up and continues the answer; Codex prints the continuation, built from
   the recalled fact, and never answers an unknown call ("unsupported call").
3. ``codex exec resume --last`` continues that session. Codex sends back its
   history with the anchor item; upstream gets, in its place, the exact
   ``function_call`` + ``function_call_output`` bytes the follow-up sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.testing import FakeUpstream, wait_until_stored

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
from agent_cli import (
    CODEX_BIN,
    Run,
    agent_binary,
    base_env,
    chatgpt_auth_json,
    codex_apikey_config,
    codex_chatgpt_config,
    codex_exec,
    run,
)

pytestmark = pytest.mark.clients

API_KEY = "sk-test-codex-recall-0123456789"
FACT = "The billing service deploys from the tangerine branch."
QUERY = "billing service deploy branch"
RECALL_HEADER = f'http_headers = {{ "x-fake-scenario" = "recall:{QUERY}" }}'




def with_recall_header(config: str) -> str:
    """The same provider, with every request asking the fake model to call recall."""
    return config.replace('wire_api = "responses"', 'wire_api = "responses"\n' + RECALL_HEADER)


def resume_last(binary: Path, tmp: Path, config: str, prompt: str,
                extra_env: dict[str, str]) -> Run:
    """``codex exec resume --last``: the next turn of the newest session in this cwd."""
    codex_home = tmp / "codexhome"
    (codex_home / "config.toml").write_text(config)
    env = base_env(tmp / "home") | {"CODEX_HOME": str(codex_home)} | extra_env
    argv = [str(binary), "exec", "--skip-git-repo-check", "resume", "--last", prompt]
    return run(argv, env, tmp / "work")


def responses_turns(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.model_requests if r.route.endswith("/responses")]


@pytest.mark.parametrize("mode", ["apikey", "chatgpt"])
def test_codex_recalls_a_fact_from_an_earlier_run(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, mode: str) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    gw = make_gateway()
    env: dict[str, str] = {}
    auth_json: str | None = None
    if mode == "apikey":
        config = codex_apikey_config(gw.url)
        env = {"FAKE_API_KEY": API_KEY}
        route = "/v1/responses"
    else:
        auth_json, _ = chatgpt_auth_json()
        config = codex_chatgpt_config(gw.url, fake_upstream.url + "/backend-api/")
        route = "/backend-api/codex/responses"

    first = codex_exec(codex, tmp_path, config, f"Remember this: {FACT}",
                       extra_env=env, auth_json=auth_json)
    assert first.returncode == 0, first.stderr[-3000:]
    wait_until_stored(gw, FACT)
    fake_upstream.reset()

    second = codex_exec(codex, tmp_path, with_recall_header(config),
                        "Which branch does billing deploy from?", extra_env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "According to memory" in second.stdout, second.stdout
    assert FACT in second.stdout, second.stdout
    turns = responses_turns(fake_upstream)
    assert [t.route for t in turns] == [route, route]
    assert all(b"unsupported call" not in t.body for t in turns)
    principal, follow_up = turns
    assert principal.json["stream"] is True and follow_up.json["stream"] is True
    assert any(t.get("name") == "recall" for t in follow_up.json["tools"])
    sent = follow_up.json["input"]
    assert len(sent) == len(principal.json["input"]) + 2
    call, output = sent[-2:]
    assert call["type"] == "function_call" and call["name"] == "recall"
    assert output["type"] == "function_call_output" and output["call_id"] == call["call_id"]
    assert FACT in output["output"]
    # The exact bytes of the pair as the follow-up sent them.
    pair = orjson.dumps(call) + b"," + orjson.dumps(output)
    assert pair in follow_up.body

    fake_upstream.reset()
    third = resume_last(codex, tmp_path, config, "thanks", env)
    assert third.returncode == 0, third.stderr[-3000:]
    (next_turn,) = responses_turns(fake_upstream)
    assert b"unsupported call" not in next_turn.body
    assert b"lore-recall:" not in next_turn.body
    history = next_turn.json["input"]
    assert any(history[i:i + 2] == [call, output] for i in range(len(history) - 1)), (
        json.dumps(history)[-3000:])
    assert pair in next_turn.body
