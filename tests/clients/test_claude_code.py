"""Real Claude Code (``claude -p``) completes a turn through the gateway, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_cli import CLAUDE_BIN, agent_binary, claude_print

from lore_gateway.testing import FakeUpstream

pytestmark = pytest.mark.clients

API_KEY = "sk-ant-test-claude-0123456789"


def test_claude_print_with_api_key(
    gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    result = claude_print(claude, tmp_path, gateway.url, "say hi",
                          extra_env={"ANTHROPIC_API_KEY": API_KEY})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == fake_upstream.text
    turns = fake_upstream.model_requests
    assert turns, "Claude Code sent no model request"
    for turn in turns:
        assert turn.path == "/v1/messages?beta=true"
        assert turn.headers["x-api-key"] == API_KEY
        assert turn.headers["anthropic-version"] == "2023-06-01"
    assert any(m.get("role") == "user" for m in turns[-1].json["messages"])


def test_claude_print_with_bearer_token_and_recorded_stream(
    gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    result = claude_print(claude, tmp_path, gateway.url, "say hi", extra_env={
        "ANTHROPIC_AUTH_TOKEN": "tok-test-claude",
        "ANTHROPIC_CUSTOM_HEADERS": "x-fake-replay: anthropic/sdk__basic_response.sse",
    })
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "Hello there!"
    assert fake_upstream.model_requests[-1].headers["authorization"] == "Bearer tok-test-claude"
