"""``lore logs [-f] [-n N] [--path]``: show the gateway's log file."""

from __future__ import annotations

import collections
import contextlib
import sys
import time
from pathlib import Path

import typer

from lore_gateway.cli import preflight
from lore_gateway.cli.main import app
from lore_gateway.obs.logging import log_file_path

FOLLOW_POLL_S = 0.25


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines, reading the file once with a bounded buffer."""
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        return list(collections.deque(handle, maxlen=count))


def follow(path: Path) -> None:
    """Print lines as they are appended, reopening the file when it is rotated."""
    handle = path.open("r", encoding="utf-8", errors="replace")
    handle.seek(0, 2)
    inode = path.stat().st_ino
    try:
        while True:
            line = handle.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
                continue
            time.sleep(FOLLOW_POLL_S)
            try:
                if path.stat().st_ino != inode:  # rotated: the new file starts empty
                    handle.close()
                    handle = path.open("r", encoding="utf-8", errors="replace")
                    inode = path.stat().st_ino
            except FileNotFoundError:
                continue
    finally:
        handle.close()


@app.command("logs")
def logs_command(
    follow_: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines."),
    lines: int = typer.Option(50, "-n", "--lines", min=0, help="How many past lines to show."),
    path_only: bool = typer.Option(False, "--path", help="Print the log file's path and exit."),
) -> None:
    """Show the gateway's recent log lines (no payloads, no credentials)."""
    path = log_file_path(preflight.settings().data_dir)
    if path_only:
        typer.echo(str(path))
        return
    if not path.exists():
        typer.echo(f"no log yet at {path}: start the gateway with `lore serve` or `lore run`",
                   err=True)
        raise typer.Exit(1)
    for line in tail_lines(path, lines) if lines else []:
        sys.stdout.write(line)
    sys.stdout.flush()
    if follow_:
        with contextlib.suppress(KeyboardInterrupt):
            follow(path)
