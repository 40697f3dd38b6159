"""Real OpenCode (``opencode run``) through the gateway, offline (issue 35).

``lore setup opencode`` writes the only config that points OpenCode at the
gateway (no hand-written provider); two ``opencode run`` sessions follow in one
project, and the second one's model recalls what the first was told through the
hidden recall tool (the fake upstream scripts the call; OpenCode never sees it).
``lore setup --undo opencode`` then gives the user's opencode.jsonc back byte for
byte. ``lore run opencode`` does the same for one run without writing a file.

OpenCode 1.18 reaches nothing outside loopback with the flags in ``opencode_env``
(models.dev, the default plugins, LSP downloads and the update check off); each
run passes ``--title`` so no separate title request is made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import pytest
from agent_cli import RUN_TIMEOUT_S, agent_binary, base_env, run
from typer.testing import CliRunner

from lore_gateway.cli import run as _run_cli  # noqa: F401  (attaches the commands)
from lore_gateway.cli import setup as _setup_cli  # noqa: F401
from lore_gateway.cli.main import app
from lore_gateway.testing import FakeUpstream, wait_until_stored

pytestmark = pytest.mark.clients

REPO = Path(__file__).resolve().parents[2]
OPENCODE_BIN = REPO / ".tools/node_modules/opencode-ai/bin/opencode.exe"
API_KEY = "sk-ant-test-opencode-0123456789"
MODEL = "anthropic/claude-sonnet-4-5"
FACT = "The invoicing worker deploys from the persimmon branch."
QUERY = "invoicing worker deploy branch"
USER_CONFIG = b"""// my OpenCode settings
{
  "$schema": "https://opencode.ai/config.json",
  "share": "disabled", // never share
  "autoupdate": false,
}
"""


def opencode_env(home: Path) -> dict[str, str]:
    """A fresh HOME, the user's key, and OpenCode's outside traffic switched off."""
    return base_env(home) | {
        "XDG_CONFIG_HOME": str(home / ".config"),
        "ANTHROPIC_API_KEY": API_KEY,
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }


def lore(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_setup_then_two_sessions_recall_across_them_and_undo_restores(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_OPENCODE_BIN", OPENCODE_BIN)
    gw = make_gateway()
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = opencode_env(home)
    config = home / ".config" / "opencode" / "opencode.jsonc"
    config.parent.mkdir(parents=True)
    config.write_bytes(USER_CONFIG)
    lore_env = {"HOME": str(home), "XDG_CONFIG_HOME": env["XDG_CONFIG_HOME"],
                "LORE_DATA_DIR": str(tmp_path / "lore-setup"), "LORE_HOST": "127.0.0.1",
                "LORE_PORT": gw.url.rsplit(":", 1)[1], "LORE_TENANCY": "personal",
                "LORE_KEY": ""}
    lore(lore_env, "setup", "opencode")

    first = run([str(binary), "run", "--title", "one", "-m", MODEL, f"Remember this: {FACT}"],
                env, work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.strip() == fake_upstream.text
    wait_until_stored(gw, FACT)
    (told,) = fake_upstream.model_requests
    assert told.path == "/v1/messages" and told.headers["x-api-key"] == API_KEY
    fake_upstream.reset()
    fake_upstream.default_scenario = f"recall:{QUERY}"

    second = run([str(binary), "run", "--title", "two", "-m", MODEL,
                  "Which branch does the invoicing worker deploy from?"], env, work)
    assert second.returncode == 0, second.stderr[-3000:]
    assert FACT in second.stdout and "According to memory" in second.stdout, second.stdout
    # Two OpenCode sessions. The recall call never reached OpenCode (it would have
    # answered with an unknown-tool error in a third request): the gateway sent
    # the follow-up with the recalled fact itself.
    asked, follow_up = fake_upstream.model_requests
    assert asked.headers["x-session-id"] != told.headers["x-session-id"]
    assert any(t["name"] == "recall" for t in asked.json["tools"])
    assert FACT in str(follow_up.json["messages"][-1]["content"])
    # No header names the project: the gateway read it from OpenCode's prompt.
    assert {s.project for s in gw.memory.sessions(None)} == {str(work)}

    # The next turn of that session (opencode run -c): upstream gets the follow-up's
    # exact pair where OpenCode's transcript holds the marker.
    pair = follow_up.json["messages"][-2:]
    fake_upstream.reset()
    third = run([str(binary), "run", "-c", "-m", MODEL, "thanks"], env, work)
    assert third.returncode == 0, third.stderr[-3000:]
    history = fake_upstream.model_requests[-1].json["messages"]
    assert any(history[i:i + 2] == pair for i in range(len(history) - 1))
    assert "lore-recall:" not in str(history)

    lore(lore_env, "setup", "--undo", "opencode")
    assert config.read_bytes() == USER_CONFIG


def test_lore_run_opencode_writes_no_file_and_sends_the_project(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    binary = agent_binary("LORE_TEST_OPENCODE_BIN", OPENCODE_BIN)
    sys.path.insert(0, str(REPO / "tests" / "ops"))
    from opskit import free_port

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    env = opencode_env(home) | {
        "LORE_DATA_DIR": str(tmp_path / "data"), "LORE_HOST": "127.0.0.1",
        "LORE_PORT": str(free_port()), "LORE_UPSTREAM_OPENAI": fake_upstream.url,
        "LORE_UPSTREAM_ANTHROPIC": fake_upstream.url, "LORE_EMBEDDINGS": "false",
        "LORE_OPENCODE_BIN": str(binary),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "lore_gateway", "run", "opencode", "--", "run", "--title", "t",
         "-m", MODEL, "say hi"],
        env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == fake_upstream.text
    (turn,) = fake_upstream.model_requests
    assert turn.path == "/v1/messages" and turn.headers["x-api-key"] == API_KEY
    assert "x-lore-project" not in turn.headers  # the gateway's own header stays with it
    # No config file was written (OpenCode itself only puts a .gitignore there).
    assert not list((home / ".config" / "opencode").glob("*.json*"))
    # X-Lore-Project reached the gateway: the turn is stored under OpenCode's cwd.
    conn = apsw.Connection(str(tmp_path / "data" / "lore.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        projects = [row[0] for row in conn.execute("SELECT project FROM turns WHERE complete = 1")]
    finally:
        conn.close()
    assert projects == [str(work)]
