"""`lore setup` / `lore setup --undo`: the agent's config comes back byte for byte."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lore_gateway.cli import setup as _setup_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli.main import app

CODEX_CONFIG = b"""# my codex config
model = "gpt-5.3-codex"   # favourite
model_provider = "openrouter"

[model_providers.openrouter]
name = "OpenRouter"
base_url = "https://openrouter.ai/api/v1"
env_key = "OPENROUTER_API_KEY"

[features]
plugins = false
"""

CLAUDE_SETTINGS = b'{\n    "permissions": {"allow": ["Bash(ls:*)"]},\n    "env": {"FOO": "1"}\n}'


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "CODEX_HOME": str(tmp_path / "home" / ".codex"),
        "LORE_DATA_DIR": str(tmp_path / "data"),
        "LORE_PORT": "43210",
    }


def lore(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def codex_config(env: dict[str, str]) -> Path:
    return Path(env["CODEX_HOME"]) / "config.toml"


def claude_settings(env: dict[str, str]) -> Path:
    return Path(env["HOME"]) / ".claude" / "settings.json"


@pytest.mark.parametrize("original", [CODEX_CONFIG, None, CODEX_CONFIG.replace(b"\n", b"\r\n")])
def test_codex_setup_then_undo_is_byte_identical(env: dict[str, str], original: bytes | None):
    path = codex_config(env)
    if original is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(original)

    code, out = lore(env, "setup", "codex")
    assert code == 0, out
    written = tomllib.loads(path.read_text())
    assert written["model_provider"] == "lore"
    provider = written["model_providers"]["lore"]
    assert provider["base_url"] == "http://127.0.0.1:43210/v1"
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY"
    if original is not None:
        # The user's own settings are still there.
        assert written["model"] == "gpt-5.3-codex"
        assert written["model_providers"]["openrouter"]["env_key"] == "OPENROUTER_API_KEY"
        assert b"# my codex config" in path.read_bytes()

    code, out = lore(env, "setup", "--status")
    assert code == 0 and "codex" in out

    code, out = lore(env, "setup", "--undo", "codex")
    assert code == 0, out
    if original is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == original


def test_codex_setup_uses_chatgpt_backend_for_chatgpt_login(env: dict[str, str]):
    home = Path(env["CODEX_HOME"])
    home.mkdir(parents=True)
    (home / "auth.json").write_text(json.dumps({"auth_mode": "chatgpt", "tokens": {}}))
    assert lore(env, "setup", "codex")[0] == 0
    provider = tomllib.loads(codex_config(env).read_text())["model_providers"]["lore"]
    assert provider["base_url"] == "http://127.0.0.1:43210/backend-api/codex"
    assert provider["requires_openai_auth"] is True
    assert "env_key" not in provider


def test_codex_undo_keeps_later_user_edits(env: dict[str, str]):
    path = codex_config(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(CODEX_CONFIG)
    assert lore(env, "setup", "codex")[0] == 0
    path.write_bytes(path.read_bytes() + b"\n[tui]\nnotifications = true\n")

    code, out = lore(env, "setup", "--undo", "codex")
    assert code == 0, out
    assert path.read_bytes() == CODEX_CONFIG + b"\n[tui]\nnotifications = true\n"


def test_codex_undo_refuses_when_lores_lines_were_edited(env: dict[str, str]):
    path = codex_config(env)
    assert lore(env, "setup", "codex")[0] == 0
    edited = path.read_bytes().replace(b'wire_api = "responses"', b'wire_api = "responses" # mine')
    path.write_bytes(edited)

    code, out = lore(env, "setup", "--undo", "codex")
    assert code == 1
    assert "cannot be taken out safely" in out
    assert path.read_bytes() == edited  # nothing was written


def test_codex_setup_refuses_twice(env: dict[str, str]):
    assert lore(env, "setup", "codex")[0] == 0
    code, out = lore(env, "setup", "codex")
    assert code == 1 and "already set up" in out


@pytest.mark.parametrize("original", [CLAUDE_SETTINGS, None])
def test_claude_setup_then_undo_is_byte_identical(env: dict[str, str], original: bytes | None):
    path = claude_settings(env)
    if original is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(original)

    code, out = lore(env, "setup", "claude")
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:43210"
    assert data["env"]["DISABLE_AUTO_COMPACT"] == "1"  # the gateway manages the window
    if original is not None:
        assert data["env"]["FOO"] == "1"
        assert data["permissions"] == {"allow": ["Bash(ls:*)"]}

    code, out = lore(env, "setup", "--undo", "claude")
    assert code == 0, out
    if original is None:
        assert not path.exists()
    else:
        assert path.read_bytes() == original


def test_claude_undo_merges_later_edits_and_restores_previous_url(env: dict[str, str]):
    path = claude_settings(env)
    path.parent.mkdir(parents=True)
    path.write_text('{"env": {"ANTHROPIC_BASE_URL": "http://corp-proxy:8080"}}')
    assert lore(env, "setup", "claude")[0] == 0
    data = json.loads(path.read_text())
    data["model"] = "opus"
    path.write_text(json.dumps(data))

    assert lore(env, "setup", "--undo", "claude")[0] == 0
    assert json.loads(path.read_text()) == {
        "env": {"ANTHROPIC_BASE_URL": "http://corp-proxy:8080"}, "model": "opus",
    }


def test_claude_setup_keeps_the_users_own_auto_compact_choice(env: dict[str, str]):
    path = claude_settings(env)
    path.parent.mkdir(parents=True)
    original = b'{"env": {"DISABLE_AUTO_COMPACT": "0"}}'
    path.write_bytes(original)
    assert lore(env, "setup", "claude")[0] == 0
    assert json.loads(path.read_text())["env"]["DISABLE_AUTO_COMPACT"] == "0"
    assert lore(env, "setup", "--undo", "claude")[0] == 0
    assert json.loads(path.read_text()) == json.loads(original)


def test_undo_without_setup_says_so(env: dict[str, str]):
    code, out = lore(env, "setup", "--undo", "claude")
    assert code == 1 and "not set up by lore" in out


def test_team_mode_setup_writes_the_gateway_key_header_and_undo_restores(
        env: dict[str, str]):
    team = env | {"LORE_TENANCY": "keys", "LORE_KEY": "lore_k_team-key-for-setup"}
    code, out = lore(env | {"LORE_TENANCY": "keys", "LORE_KEY": ""}, "setup", "codex")
    assert code == 1 and "LORE_KEY" in out and "lore keys create" in out
    path = codex_config(env)
    path.parent.mkdir(parents=True)
    path.write_bytes(CODEX_CONFIG)
    code, out = lore(team, "setup", "codex")
    assert code == 0, out
    provider = tomllib.loads(path.read_text())["model_providers"]["lore"]
    assert provider["http_headers"] == {"X-Lore-Key": "lore_k_team-key-for-setup"}
    assert lore(team, "setup", "--undo", "codex")[0] == 0
    assert path.read_bytes() == CODEX_CONFIG

    settings = claude_settings(env)
    settings.parent.mkdir(parents=True)
    settings.write_text('{"env": {"ANTHROPIC_CUSTOM_HEADERS": "X-Team: red"}}')
    original = settings.read_bytes()
    assert lore(team, "setup", "claude")[0] == 0
    headers = json.loads(settings.read_text())["env"]["ANTHROPIC_CUSTOM_HEADERS"]
    assert headers == "X-Team: red\nX-Lore-Key: lore_k_team-key-for-setup"
    data = json.loads(settings.read_text())
    data["model"] = "opus"  # a later edit of the user's: undo merges
    settings.write_text(json.dumps(data))
    assert lore(team, "setup", "--undo", "claude")[0] == 0
    assert json.loads(settings.read_text()) == {**json.loads(original), "model": "opus"}
