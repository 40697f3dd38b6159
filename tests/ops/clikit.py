"""Run ``lore`` as a user does: a child process, its own environment, its exit code.

``without_root_powers()`` is what a read-only directory test needs: as root, mode
bits alone do not stop a write.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from opskit import REPO

LORE_TIMEOUT_S = 60


def lore_env(root: Path, **settings: str) -> dict[str, str]:
    """A clean environment: HOME, config dir and data dir under ``root``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO / "src"),
        "HOME": str(root / "home"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "LORE_DATA_DIR": str(root / "data"),
        "LORE_EMBEDDINGS": "false",
        # The backend suites' Postgres database (tests/conftest.py), when there is one.
        **({"LORE_DATABASE_URL": os.environ["LORE_DATABASE_URL"]}
           if "LORE_DATABASE_URL" in os.environ else {}),
        **settings,
    }


def lore(env: dict[str, str], *args: str,
         prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "lore_gateway", *args],
                          env=env, capture_output=True, text=True, timeout=LORE_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``lore: error:`` line; fails on anything more (a traceback, say)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("lore: error: "), lines
    return lines[0]


def without_root_powers() -> list[str]:
    """A command prefix under which mode bits bind: as root, ``setpriv`` drops the
    capabilities that override them (root is otherwise never denied a write)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: mode bits cannot make a dir read-only")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def make_read_only(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


def make_writable(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(env: dict[str, str], *args: str, columns: int = 80) -> str:
    """``lore *args`` with stdout and stderr on a pseudo-terminal ``columns`` wide; the
    text it showed, colours removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "lore_gateway", *args],
                               env=env | {"COLUMNS": str(columns), "TERM": "xterm-256color"},
                               stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        process.wait(timeout=LORE_TIMEOUT_S)
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
