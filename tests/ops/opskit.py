"""Helpers for the operations tests: an isolated HOME / CODEX_HOME / data dir.

Imported by module name (``from opskit import ...``): pytest puts this folder on
sys.path, and a second module named ``conftest`` would clash with the root one.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from lore_gateway.testing import FakeUpstream

REPO = Path(__file__).resolve().parents[2]
# Fake credentials, also the ones the credential-leak test greps for.
OPENAI_KEY = "sk-proj-opstest-0123456789abcdefghij"
ANTHROPIC_KEY = "sk-ant-api03-opstest-0123456789abcdefghij"

CODEX_BIN = REPO / ".tools/node_modules/.bin/codex"
CLAUDE_BIN = REPO / ".tools/node_modules/@anthropic-ai/claude-code/bin/claude.exe"

# Codex 0.171 reaches github.com (plugins) and ab.chatgpt.com (analytics) unless
# told not to (shared/reference/real-clients.md, "Keeping it loopback-only").
CODEX_OFFLINE_CONFIG = """model = "gpt-fake"
check_for_update_on_startup = false
[analytics]
enabled = false
[features]
plugins = false
remote_plugin = false
apps = false
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ops_env(tmp_path: Path, fake: FakeUpstream, port: int) -> dict[str, str]:
    """Environment for a `lore` child: everything under tmp_path, upstreams on the fake."""
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(CODEX_OFFLINE_CONFIG)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "LORE_DATA_DIR": str(tmp_path / "data"),
        "LORE_HOST": "127.0.0.1",
        "LORE_PORT": str(port),
        "LORE_UPSTREAM_OPENAI": fake.url,
        "LORE_UPSTREAM_CHATGPT": fake.url + "/backend-api",
        "LORE_UPSTREAM_ANTHROPIC": fake.url,
        "LORE_EMBEDDINGS": "false",
        "LORE_CODEX_BIN": str(CODEX_BIN),
        "LORE_CLAUDE_BIN": str(CLAUDE_BIN),
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
