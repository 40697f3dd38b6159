"""The real Codex CLI completes a turn through the gateway, offline, in both modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_cli import (
    ACCOUNT_ID,
    CODEX_BIN,
    agent_binary,
    chatgpt_auth_json,
    codex_apikey_config,
    codex_chatgpt_config,
    codex_exec,
)

from lore_gateway.testing import FakeUpstream

pytestmark = pytest.mark.clients

API_KEY = "sk-test-codex-0123456789"


def test_codex_exec_with_api_key_provider(
    gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    result = codex_exec(codex, tmp_path, codex_apikey_config(gateway.url), "say hi",
                        extra_env={"FAKE_API_KEY": API_KEY})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == fake_upstream.text
    (turn,) = fake_upstream.model_requests
    assert turn.path == "/v1/responses"
    assert turn.headers["authorization"] == f"Bearer {API_KEY}"
    assert turn.headers["originator"] == "codex_exec"
    assert turn.json["stream"] is True and turn.json["model"] == "gpt-fake"
    assert turn.json["input"][-1]["content"][0]["text"] == "say hi"


def test_codex_exec_with_chatgpt_login_provider(
    gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    auth_json, access_token = chatgpt_auth_json()
    # Helper GETs (accounts check, models) go to chatgpt_base_url, which Codex
    # calls directly, not through the provider: point it at the fake.
    config = codex_chatgpt_config(gateway.url, fake_upstream.url + "/backend-api/")
    result = codex_exec(codex, tmp_path, config, "say hi", auth_json=auth_json)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == fake_upstream.text
    turns = [r for r in fake_upstream.model_requests if r.route.endswith("/responses")]
    (turn,) = turns
    assert turn.path == "/backend-api/codex/responses"
    assert turn.headers["authorization"] == f"Bearer {access_token}"
    assert turn.headers["chatgpt-account-id"] == ACCOUNT_ID
    assert turn.json["stream"] is True and turn.json["store"] is False


def test_codex_exec_shows_the_answer_of_a_recorded_stream(
    gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, fixtures_dir: Path
) -> None:
    """A real backend stream (rate limits first) reaches Codex intact."""
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    fixture = fixtures_dir / "codex/served-streams/text_with_codex_rate_limits_first_accepted.sse"
    config = codex_apikey_config(gateway.url).replace(
        'wire_api = "responses"',
        f'wire_api = "responses"\nhttp_headers = {{ "x-fake-replay" = "{fixture}" }}')
    result = codex_exec(codex, tmp_path, config, "say hi", extra_env={"FAKE_API_KEY": API_KEY})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "Hi from the fake upstream!"
    assert fake_upstream.model_requests[0].headers["x-fake-replay"] == str(fixture)
