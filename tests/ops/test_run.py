"""`lore run codex|claude`: the real agent CLIs complete a turn through a gateway
that `lore run` started itself, and that gateway is gone afterwards."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import apsw
import pytest
from opskit import ANTHROPIC_KEY, CLAUDE_BIN, CODEX_BIN, OPENAI_KEY, free_port, ops_env

from lore_gateway.testing import FakeUpstream

pytestmark = pytest.mark.clients
RUN_TIMEOUT_S = 180


def lore_run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lore_gateway", "run", *args],
        env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )


def assert_port_free(port: int) -> None:
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on {port}"


def stored_projects(data_dir: Path) -> list[str]:
    """The project of every complete turn the gateway stored."""
    conn = apsw.Connection(str(data_dir / "lore.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return [row[0] for row in conn.execute("SELECT project FROM turns WHERE complete = 1")]
    finally:
        conn.close()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.mark.skipif(not CODEX_BIN.exists(), reason=f"Codex CLI not installed at {CODEX_BIN}")
def test_lore_run_codex(fake_upstream: FakeUpstream, tmp_path: Path, workdir: Path, port: int):
    env = ops_env(tmp_path, fake_upstream, port)

    result = lore_run(env, workdir, "codex", "--", "exec", "--skip-git-repo-check", "say hi")

    assert result.returncode == 0, result.stderr[-4000:]
    assert "Hi from the fake upstream!" in result.stdout
    calls = [r for r in fake_upstream.model_requests if r.path == "/v1/responses"]
    assert calls, [r.path for r in fake_upstream.requests]
    assert calls[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    # X-Lore-Project reached the gateway: the turn is stored under the agent's cwd.
    assert stored_projects(tmp_path / "data") == [str(workdir)]
    assert_port_free(port)


@pytest.mark.skipif(not CLAUDE_BIN.exists(), reason=f"Claude Code not installed at {CLAUDE_BIN}")
def test_lore_run_claude(fake_upstream: FakeUpstream, tmp_path: Path, workdir: Path, port: int):
    env = ops_env(tmp_path, fake_upstream, port)

    result = lore_run(env, workdir, "claude", "--", "-p", "say hi")

    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip(), result.stderr[-4000:]
    calls = [r for r in fake_upstream.model_requests if r.path.startswith("/v1/messages")]
    assert calls, [r.path for r in fake_upstream.requests]
    assert calls[0].headers["x-api-key"] == ANTHROPIC_KEY
    # X-Lore-Project reached the gateway: the turn is stored under the agent's cwd.
    assert stored_projects(tmp_path / "data") == [str(workdir)]
    assert_port_free(port)


@pytest.mark.skipif(not CODEX_BIN.exists(), reason=f"Codex CLI not installed at {CODEX_BIN}")
def test_lore_run_passes_the_agents_exit_code(
    fake_upstream: FakeUpstream, tmp_path: Path, workdir: Path, port: int
):
    env = ops_env(tmp_path, fake_upstream, port)
    result = lore_run(env, workdir, "codex", "--", "no-such-subcommand-xyz")
    assert result.returncode not in (0, None)
    direct = subprocess.run(
        [str(CODEX_BIN), "no-such-subcommand-xyz"], env=env, cwd=workdir,
        stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == direct.returncode
    assert_port_free(port)


def test_lore_run_names_a_missing_binary(fake_upstream: FakeUpstream, tmp_path: Path,
                                         workdir: Path, port: int):
    env = ops_env(tmp_path, fake_upstream, port) | {"LORE_CLAUDE_BIN": "no-such-claude-binary"}
    result = lore_run(env, workdir, "claude", "--", "-p", "hi")
    assert result.returncode == 2
    assert result.stderr == ("lore: error: cannot find the claude binary 'no-such-claude-binary' "
                             "(LORE_CLAUDE_BIN): install it or set LORE_CLAUDE_BIN to its path\n")
    assert_port_free(port)


def _fake_jwt(account_id: str) -> str:
    """An unsigned JWT shaped like a ChatGPT login token; Codex does not verify it."""
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {
        "email": "ops@example.com", "exp": int(time.time()) + 3600,
        "https://api.openai.com/auth": {
            "chatgpt_plan_type": "plus", "chatgpt_user_id": "user-fake",
            "chatgpt_account_id": account_id,
        },
    }
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.sig"


@pytest.mark.skipif(not CODEX_BIN.exists(), reason=f"Codex CLI not installed at {CODEX_BIN}")
def test_lore_run_codex_with_chatgpt_login_uses_the_codex_backend(
    fake_upstream: FakeUpstream, tmp_path: Path, workdir: Path, port: int
):
    env = ops_env(tmp_path, fake_upstream, port)
    del env["OPENAI_API_KEY"]
    codex_home = Path(env["CODEX_HOME"])
    token = _fake_jwt("acct-ops-1234")
    (codex_home / "auth.json").write_text(json.dumps({
        "auth_mode": "chatgpt", "OPENAI_API_KEY": None,
        "tokens": {"id_token": token, "access_token": token, "refresh_token": "rt_fake",
                   "account_id": "acct-ops-1234"},
        "last_refresh": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }))
    # Codex's own helper calls go to chatgpt_base_url; keep them on loopback too.
    with (codex_home / "config.toml").open("a") as config:
        config.write(f'chatgpt_base_url = "{fake_upstream.url}/backend-api/"\n'
                     'cli_auth_credentials_store = "file"\n')
    config_text = (codex_home / "config.toml").read_text()
    # Top-level keys must precede the tables: rewrite them to the front.
    top = [line for line in config_text.splitlines() if line.startswith(("chatgpt_", "cli_"))]
    rest = [line for line in config_text.splitlines() if line not in top]
    (codex_home / "config.toml").write_text("\n".join(top + rest) + "\n")

    result = lore_run(env, workdir, "codex", "--", "exec", "--skip-git-repo-check", "say hi")

    assert result.returncode == 0, result.stderr[-4000:]
    assert "Hi from the fake upstream!" in result.stdout
    calls = [r for r in fake_upstream.model_requests
             if r.path == "/backend-api/codex/responses"]
    assert calls, [r.path for r in fake_upstream.requests]
    assert calls[0].headers["authorization"] == f"Bearer {token}"
    assert calls[0].headers["chatgpt-account-id"] == "acct-ops-1234"
    assert_port_free(port)


def test_codex_overrides_carry_the_project_header(tmp_path: Path):
    from lore_gateway.agents import codex

    args = codex.run_overrides("http://127.0.0.1:3207", codex.AuthMode.API_KEY_ENV, "/w/p q")
    assert args[0] == "-c" and args[2] == "-c"
    key, _, value = args[1].partition("=")
    assert key == "model_providers.lore"
    table = tomllib.loads(f"t = {value}")["t"]
    assert table == {
        "name": "lore", "base_url": "http://127.0.0.1:3207/v1", "wire_api": "responses",
        "env_key": "OPENAI_API_KEY", "http_headers": {"X-Lore-Project": "/w/p q"},
    }
    assert args[3] == 'model_provider="lore"'


def test_claude_env_appends_the_project_header():
    from lore_gateway.agents import claude

    env = claude.run_env("http://127.0.0.1:3207", "/w/p", {"ANTHROPIC_CUSTOM_HEADERS": "A: b"})
    assert env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:3207",
        "DISABLE_AUTO_COMPACT": "1",
        "ANTHROPIC_CUSTOM_HEADERS": "A: b\nX-Lore-Project: /w/p",
    }


def test_claude_run_turns_auto_compaction_off_unless_the_user_chose():
    from lore_gateway.agents import claude

    assert claude.run_env("http://g", None, {})["DISABLE_AUTO_COMPACT"] == "1"
    assert "DISABLE_AUTO_COMPACT" not in claude.run_env("http://g", None,
                                                        {"DISABLE_AUTO_COMPACT": "0"})


def test_team_mode_run_sends_the_gateway_key_from_lore_key():
    from lore_gateway.agents import claude, codex
    from lore_gateway.cli.run import gateway_key
    from lore_gateway.config import Settings

    args = codex.run_overrides("http://127.0.0.1:3207", codex.AuthMode.API_KEY_ENV, None,
                               "LORE_KEY")
    table = tomllib.loads(f"t = {args[1].partition('=')[2]}")["t"]
    # Codex reads the key from the environment: it never appears on the command line.
    assert table["env_http_headers"] == {"X-Lore-Key": "LORE_KEY"}
    env = claude.run_env("http://127.0.0.1:3207", None, {}, "lore_k_abc")
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-Lore-Key: lore_k_abc"
    team = Settings(tenancy="keys")
    assert gateway_key(team, {"LORE_KEY": "lore_k_abc"}) == "lore_k_abc"
    with pytest.raises(RuntimeError, match="LORE_KEY"):
        gateway_key(team, {})
    assert gateway_key(Settings(), {}) is None


@pytest.mark.skipif(not CODEX_BIN.exists(), reason=f"Codex CLI not installed at {CODEX_BIN}")
def test_lore_run_codex_with_stored_api_key(
    fake_upstream: FakeUpstream, tmp_path: Path, workdir: Path, port: int
):
    env = ops_env(tmp_path, fake_upstream, port)
    del env["OPENAI_API_KEY"]  # the key lives only in auth.json (`codex login --api-key`)
    stored_key = "sk-proj-stored-0123456789abcdefghij"
    (Path(env["CODEX_HOME"]) / "auth.json").write_text(
        json.dumps({"auth_mode": "apikey", "OPENAI_API_KEY": stored_key})
    )

    result = lore_run(env, workdir, "codex", "--", "exec", "--skip-git-repo-check", "say hi")

    assert result.returncode == 0, result.stderr[-4000:]
    calls = [r for r in fake_upstream.model_requests if r.path == "/v1/responses"]
    assert calls and calls[0].headers["authorization"] == f"Bearer {stored_key}"
