"""``lore uninstall``: after ``lore setup`` for Codex and Claude Code (a temp HOME) and
with a gateway running, ``--dry-run`` lists exactly what ``--purge --yes`` then does,
and afterwards the agents' config files are their pre-setup bytes (or gone, when
there was none), the gateway is stopped and the data dir is gone (issue 36)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from clikit import lore, lore_env
from opskit import free_port

from lore_gateway.cli.run import probe_health

CODEX_CONFIG = b'# mine\nmodel = "gpt-5.3-codex"\r\n\n[features]\nplugins = false\n'


def steps(output: str) -> list[str]:
    return [line[4:] for line in output.splitlines() if line.startswith("  - ")]


def test_uninstall_lists_then_undoes_setup_stops_the_gateway_and_purges(
        tmp_path: Path) -> None:
    port = free_port()
    env = lore_env(tmp_path, LORE_PORT=str(port), CODEX_HOME=str(tmp_path / "home" / ".codex"))
    codex = Path(env["CODEX_HOME"]) / "config.toml"
    codex.parent.mkdir(parents=True)
    codex.write_bytes(CODEX_CONFIG)
    claude = Path(env["HOME"]) / ".claude" / "settings.json"  # none before setup
    for agent in ("codex", "claude"):
        result = lore(env, "setup", agent)
        assert result.returncode == 0, result.stderr
    assert codex.read_bytes() != CODEX_CONFIG and claude.exists()

    server = subprocess.Popen([sys.executable, "-m", "lore_gateway", "serve"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while probe_health(url) is None:
            assert server.poll() is None and time.monotonic() < deadline, "no gateway"
            time.sleep(0.05)
        data_dir = Path(env["LORE_DATA_DIR"])

        dry = lore(env, "uninstall", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        planned = steps(dry.stdout)
        assert planned == [
            f"stop the gateway at {url} (pid {server.pid})",
            f"codex: restore {codex} byte for byte from its backup",
            f"claude: remove {claude} (it did not exist before setup)",
            planned[-1]]
        assert planned[-1].startswith(f"remove {data_dir} and everything in it: ")
        assert "with --purge, also:" in dry.stdout and "Nothing was changed" in dry.stdout
        # Nothing was changed.
        assert probe_health(url) is not None and server.poll() is None
        assert codex.read_bytes() != CODEX_CONFIG and claude.exists() and data_dir.exists()

        purge = lore(env, "uninstall", "--purge", "--yes")
        assert purge.returncode == 0, purge.stderr
        assert steps(purge.stdout) == planned
        assert server.wait(timeout=30) == 0
        assert f"stopped the gateway (pid {server.pid})" in purge.stdout
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert codex.read_bytes() == CODEX_CONFIG
    assert not claude.exists()
    assert not data_dir.exists()
    again = lore(env, "uninstall", "--purge", "--dry-run")
    assert again.returncode == 0 and steps(again.stdout) == []
    assert "Nothing to undo" in again.stdout
