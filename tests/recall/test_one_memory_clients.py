"""One memory per user across agents and credentials (issue 11 acceptance), real CLIs.

Personal mode, default settings: Codex with API key A states a fact; a Claude
Code transcript holding a second fact is imported with no credential at all;
Claude Code with key B recalls the first fact and Codex with key A the imported
one. Team mode: the gateway key decides, so Claude Code with bob's key recalls
nothing of what Codex with alice's key said, and Claude Code without a key is
refused with the gateway's 401 and its instructions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lore_gateway.memory.tenancy import keys
from lore_gateway.storage import db, schema
from lore_gateway.testing import (
    BackgroundServer,
    FakeUpstream,
    gateway_settings,
    wait_until_stored,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
from agent_cli import (
    CLAUDE_BIN,
    CODEX_BIN,
    agent_binary,
    claude_print,
    codex_apikey_config,
    codex_exec,
)

pytestmark = pytest.mark.clients

KEY_A = "sk-test-one-memory-openai-0123456789"
KEY_B = "sk-ant-test-one-memory-anthropic-0123456789"
SAID = "The billing service deploys from the tangerine branch."
SAID_QUERY = "billing service deploy branch"
IMPORTED = "The staging database password rotates every ninth Thursday."
IMPORTED_QUERY = "staging database password rotates"




def recall_config(config: str, query: str, *headers: str) -> str:
    """Codex's provider, asking the fake model to call recall, plus extra headers."""
    pairs = ", ".join([f'"x-fake-scenario" = "recall:{query}"', *headers])
    return config.replace('wire_api = "responses"',
                          f'wire_api = "responses"\nhttp_headers = {{ {pairs} }}')


def transcript(path: Path, cwd: Path) -> Path:
    """A Claude Code transcript (as ~/.claude/projects/<slug>/<session>.jsonl) with a fact."""
    session = "5d0c9a55-1b61-4c2e-9f0e-7a2f6c1d3e4b"
    common = {"sessionId": session, "cwd": str(cwd), "isSidechain": False}
    lines = [
        {**common, "type": "user", "uuid": "u1", "timestamp": "2026-11-01T10:00:00.000Z",
         "message": {"role": "user", "content": f"Note for later: {IMPORTED}"}},
        {**common, "type": "assistant", "uuid": "a1", "timestamp": "2026-11-01T10:00:03.000Z",
         "message": {"role": "assistant", "model": "claude-x",
                     "content": [{"type": "text", "text": "Noted."}]}},
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def lore_import(data_dir: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LORE_", "OPENAI", "ANTHROPIC")) or k == "LORE_DATABASE_URL"}
    env |= {"LORE_DATA_DIR": str(data_dir), "LORE_EMBEDDINGS": "false"}
    return subprocess.run([sys.executable, "-m", "lore_gateway", "import", "claude-code",
                           str(path)], env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)


def test_personal_mode_one_memory_across_agents_credentials_and_imports(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw = make_gateway()
    config = codex_apikey_config(gw.url)
    codex_env = {"FAKE_API_KEY": KEY_A}

    said = codex_exec(codex, tmp_path, config, f"Remember this: {SAID}", extra_env=codex_env)
    assert said.returncode == 0, said.stderr[-3000:]
    wait_until_stored(gw, SAID)

    imported = lore_import(gw.settings.data_dir,
                           transcript(tmp_path / "claude-projects" / "p" / "s.jsonl",
                                      tmp_path / "work"))
    assert imported.returncode == 0, imported.stderr
    assert "1 new turn," in imported.stdout
    wait_until_stored(gw, IMPORTED)

    fake_upstream.reset()
    recalled = claude_print(claude, tmp_path, gw.url, "Which branch does billing deploy from?",
                            extra_env={"ANTHROPIC_API_KEY": KEY_B, "ANTHROPIC_CUSTOM_HEADERS":
                                       f"x-fake-scenario: recall:{SAID_QUERY}"})
    assert recalled.returncode == 0, recalled.stderr[-3000:]
    assert SAID in recalled.stdout and "According to memory" in recalled.stdout
    assert any(r.headers.get("x-api-key") == KEY_B for r in fake_upstream.model_requests)

    fake_upstream.reset()
    found = codex_exec(codex, tmp_path, recall_config(config, IMPORTED_QUERY),
                       "When does the staging password rotate?", extra_env=codex_env)
    assert found.returncode == 0, found.stderr[-3000:]
    assert IMPORTED in found.stdout and "According to memory" in found.stdout
    assert [t.tenant for t in gw.memory.tenants()] == ["personal"]


@pytest.fixture
def team_gateway(fake_upstream: FakeUpstream, tmp_path: Path,
                 database_url: str | None) -> Iterator[tuple[Any, str, str]]:
    settings = gateway_settings(fake_upstream, tmp_path / "data", tenancy="keys")
    conn = db.connect(settings.database)
    schema.migrate(conn)
    _, alice = keys.create(conn, "alice")
    _, bob = keys.create(conn, "bob")
    conn.close()
    from lore_gateway.server import Gateway

    runner = BackgroundServer(Gateway(settings), name="team-gateway")
    yield runner.start(), alice, bob
    runner.stop()


def test_team_mode_keys_separate_memories_and_no_key_is_refused(
        team_gateway: tuple[Any, str, str], fake_upstream: FakeUpstream,
        tmp_path: Path) -> None:
    codex = agent_binary("LORE_TEST_CODEX_BIN", CODEX_BIN)
    claude = agent_binary("LORE_TEST_CLAUDE_BIN", CLAUDE_BIN)
    gw, alice, bob = team_gateway
    config = codex_apikey_config(gw.url).replace(
        'wire_api = "responses"', f'wire_api = "responses"\nhttp_headers = {{ "X-Lore-Key" = '
        f'"{alice}" }}')
    said = codex_exec(codex, tmp_path, config, f"Remember this: {SAID}",
                      extra_env={"FAKE_API_KEY": KEY_A})
    assert said.returncode == 0, said.stderr[-3000:]
    wait_until_stored(gw, SAID, tenant="alice")
    assert all("x-lore-key" not in {k.lower() for k in r.headers}
               for r in fake_upstream.requests)

    fake_upstream.reset()
    as_bob = claude_print(claude, tmp_path, gw.url, "Which branch does billing deploy from?",
                          extra_env={"ANTHROPIC_API_KEY": KEY_A, "ANTHROPIC_CUSTOM_HEADERS":
                                     f"X-Lore-Key: {bob}\nx-fake-scenario: recall:{SAID_QUERY}"})
    assert as_bob.returncode == 0, as_bob.stderr[-3000:]
    assert "According to memory" in as_bob.stdout  # the recall ran, in bob's memory
    assert SAID not in as_bob.stdout

    fake_upstream.reset()
    no_key = claude_print(claude, tmp_path, gw.url, "hello",
                          extra_env={"ANTHROPIC_API_KEY": KEY_A})
    assert no_key.returncode != 0
    assert "X-Lore-Key" in no_key.stdout + no_key.stderr
    assert fake_upstream.model_requests == []
    assert {t.tenant for t in gw.memory.tenants()} == {"alice", "bob"}
