"""Running the real agent CLIs offline against loopback, for the client tests.

Every run gets a fresh HOME (and CODEX_HOME), a minimal environment (no proxy
variables, no real credentials from the developer's shell), stdin from
/dev/null, a timeout, and the settings that switch off each CLI's outside
traffic (see shared/reference/real-clients.md). In CI a missing binary fails
the test instead of skipping it, so the client tests can never silently vanish.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODEX_BIN = REPO / ".tools/node_modules/.bin/codex"
CLAUDE_BIN = REPO / ".tools/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
# A turn against a loopback fake takes a few seconds; a stuck CLI must not
# hold the suite for long.
RUN_TIMEOUT_S = 120
ACCOUNT_ID = "acct-fake-1234"


def agent_binary(env_var: str, default: Path) -> Path:
    """The CLI to test; a skip locally when it is not installed, a failure in CI."""
    path = Path(os.environ.get(env_var) or default)
    if path.is_file() and os.access(path, os.X_OK):
        return path
    message = f"{path} is not installed; run `make tools` (or set {env_var})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def base_env(home: Path) -> dict[str, str]:
    """Only what a CLI needs to start: no proxies, no inherited API keys."""
    return {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_PROXY": "127.0.0.1,localhost",
        "TMPDIR": str(home),
    }


def run(argv: list[str], env: dict[str, str], cwd: Path) -> Run:
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    return Run(done.returncode, done.stdout, done.stderr)


# ----------------------------------------------------------------------------- Codex

# Top-level keys must precede the first [table] in TOML, hence ``{top}``.
_CODEX_COMMON = """\
model = "gpt-fake"
model_provider = "{provider}"
check_for_update_on_startup = false
{top}
[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"""


def codex_apikey_config(gateway_url: str) -> str:
    """A custom provider on ``<gateway>/v1`` with its key from ``FAKE_API_KEY``."""
    return _CODEX_COMMON.format(provider="gwkey", top="") + f"""
[model_providers.gwkey]
name = "lore gateway (API key)"
base_url = "{gateway_url}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"
stream_max_retries = 0
request_max_retries = 0
"""


def codex_chatgpt_config(gateway_url: str, chatgpt_base_url: str) -> str:
    """A custom provider on ``<gateway>/backend-api/codex`` using the ChatGPT login."""
    top = f'chatgpt_base_url = "{chatgpt_base_url}"\ncli_auth_credentials_store = "file"\n'
    return _CODEX_COMMON.format(provider="gwchatgpt", top=top) + f"""
[model_providers.gwchatgpt]
name = "lore gateway (ChatGPT login)"
base_url = "{gateway_url}/backend-api/codex"
wire_api = "responses"
requires_openai_auth = true
stream_max_retries = 0
request_max_retries = 0
"""


def _b64(data: dict[str, object]) -> str:
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def fake_jwt(claims: dict[str, object]) -> str:
    """An unsigned JWT; Codex reads the claims and never checks a signature."""
    return f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.c2ln"


def chatgpt_auth_json() -> tuple[str, str]:
    """``auth.json`` for a ChatGPT login with fresh fake tokens, and its access token."""
    auth_claim = {
        "chatgpt_plan_type": "plus",
        "chatgpt_user_id": "user-fake",
        "chatgpt_account_id": ACCOUNT_ID,
    }
    exp = int(time.time()) + 3600
    claims = {"email": "dev@example.invalid", "exp": exp,
              "https://api.openai.com/auth": auth_claim}
    access = fake_jwt(claims)
    auth = {
        "auth_mode": "chatgpt",
        "OPENAI_API_KEY": None,
        "tokens": {"id_token": fake_jwt(claims), "access_token": access,
                   "refresh_token": "rt_fake", "account_id": ACCOUNT_ID},
        "last_refresh": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return json.dumps(auth), access


def codex_exec(binary: Path, tmp: Path, config: str, prompt: str,
               extra_env: dict[str, str] | None = None, auth_json: str | None = None) -> Run:
    home, codex_home, work = tmp / "home", tmp / "codexhome", tmp / "work"
    for folder in (home, codex_home, work):
        folder.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(config)
    if auth_json is not None:
        (codex_home / "auth.json").write_text(auth_json)
    env = base_env(home) | {"CODEX_HOME": str(codex_home)} | (extra_env or {})
    return run([str(binary), "exec", "--skip-git-repo-check", prompt], env, work)


# ----------------------------------------------------------------------------- Claude


def claude_print(binary: Path, tmp: Path, base_url: str, prompt: str,
                 extra_env: dict[str, str] | None = None) -> Run:
    home, work = tmp / "home", tmp / "work"
    for folder in (home, work):
        folder.mkdir(parents=True, exist_ok=True)
    env = base_env(home) | {
        "ANTHROPIC_BASE_URL": base_url,
        # Each of these cuts a class of outside traffic; the first alone is
        # what brings Claude Code to zero outside lookups.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    } | (extra_env or {})
    return run([str(binary), "-p", prompt], env, work)
