"""``lore uninstall [--purge] [--dry-run] [--yes]``: take lore back out.

The plan is made first and printed, the same lines for ``--dry-run`` and for the
real run, then carried out in this order:

1. stop a running gateway: the one answering ``/lore/status`` on the configured
   address names its pid; it gets SIGTERM (as ``lore run`` stops the gateway it
   started), drains its storage queue and exits;
2. undo every ``lore setup`` recorded under ``<data dir>/setup`` (each agent's
   config restored byte for byte from its backup, or removed when there was
   none before: ``agents/setup_state.py``);
3. with ``--purge``, remove the data dir: the memory database, logs, the
   setup backups.

A setup that cannot be undone safely (the file changed past what lore can take
out) stops everything before a change: its backup lives in the data dir. What
lore leaves alone is named: the config file, a Postgres database, the
``.lore.md`` files it wrote into projects. Planning reads files and asks the
gateway; it never opens the database (SQLite would add files to the data dir).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer

from lore_gateway.agents import setup_state
from lore_gateway.agents.codex import SetupConflict
from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.output import UserError
from lore_gateway.cli.run import STOP_TIMEOUT_S, probe_health
from lore_gateway.config import Settings, config_path

STOP_POLL_S = 0.1


@dataclass(slots=True)
class Plan:
    """What ``lore uninstall`` will do (``steps``) and what it leaves (``kept``)."""

    gateway_pid: int | None = None
    undo: list[tuple[str, str]] = field(default_factory=list)  # (agent, what undo does)
    data_dir: Path | None = None  # what --purge removes (None: there is none)
    data_note: str = ""
    kept: list[str] = field(default_factory=list)

    def steps(self, settings: Settings) -> list[str]:
        """What ``lore uninstall`` does without --purge."""
        lines = []
        if self.gateway_pid is not None:
            lines.append(f"stop the gateway at {settings.base_url} (pid {self.gateway_pid})")
        return lines + [f"{agent}: {what}" for agent, what in self.undo]

    def purge_steps(self) -> list[str]:
        """What --purge adds."""
        if self.data_dir is None:
            return []
        return [f"remove {self.data_dir} and everything in it{self.data_note}"]


def make_plan(settings: Settings, purge: bool) -> Plan:
    """The plan, changing nothing. Raises ``UserError`` for what the run would refuse."""
    found = Plan()
    from lore_gateway.cli.status import fetch_live

    live = fetch_live(settings)
    if live is not None:
        pid = live["gateway"].get("pid")
        if not isinstance(pid, int):
            raise UserError(f"a gateway answers at {settings.base_url} but does not say its "
                            "pid (an older version?); stop it by hand, then run this again")
        found.gateway_pid = pid
    elif probe_health(settings.base_url) is not None:
        raise UserError(f"a gateway answers at {settings.base_url} but not its status route "
                        "(an older version?); stop it by hand, then run this again")
    for agent in setup_state.set_up_agents(settings.data_dir):
        try:
            what = setup_state.undo_plan(agent, settings.data_dir)
        except SetupConflict as exc:
            raise UserError(f"cannot undo `lore setup {agent}`: {exc}") from None
        if what is not None:
            found.undo.append((agent, what))
    data_dir = settings.data_dir
    if data_dir.exists():
        found.data_dir = data_dir
        found.data_note = _contents(data_dir)
    if settings.database.backend == "postgres":
        found.kept.append(f"the memory database {settings.database.url} (Postgres): drop it "
                          "to remove the memory")
    elif not purge and settings.db_path.exists():
        found.kept.append(f"the memory in {data_dir} (`lore uninstall --purge` removes it)")
    if config_path().is_file():
        found.kept.append(f"the config file {config_path()} (your settings)")
    if settings.knowledge and settings.export:
        # Reading the database for their paths would touch it (a dry run must not).
        found.kept.append("the .lore.md files lore wrote into your projects (with a pointer"
                          " section in CLAUDE.md or AGENTS.md): project files, yours to keep")
    return found


def _contents(data_dir: Path) -> str:
    """``: a, b/, c (12.3 MB)``: the data dir's entries and their total size."""
    names, size = [], 0
    for entry in sorted(data_dir.iterdir()):
        names.append(entry.name + ("/" if entry.is_dir() else ""))
        paths = [entry] if not entry.is_dir() else [p for p in entry.rglob("*") if p.is_file()]
        for path in paths:
            with contextlib.suppress(OSError):
                size += path.stat().st_size
    if not names:
        return " (empty)"
    return f": {', '.join(names)} ({size / 1e6:.1f} MB)"


@app.command("uninstall")
def uninstall_command(
    purge: bool = typer.Option(False, "--purge", help="Also remove the data dir: the memory "
                               "database, logs and setup backups."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print exactly what would be "
                                 "stopped, restored and removed; change nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Undo every `lore setup`, stop a running gateway, and with --purge remove the
    data dir. Prints what it will do first; asks unless --yes. --dry-run lists it
    all, what --purge would remove included, and changes nothing."""
    settings = preflight.settings()
    plan = make_plan(settings, purge)
    steps = plan.steps(settings) + (plan.purge_steps() if purge else [])
    if not steps:
        output.line("Nothing to undo: no gateway runs at " + settings.base_url
                    + ", no agent was set up by lore"
                    + (", and there is no data dir." if purge else "."))
    else:
        output.line("lore uninstall would:" if dry_run else "lore uninstall will:")
        for step in steps:
            output.line(f"  - {step}")
    if dry_run and not purge and plan.purge_steps():
        output.line("with --purge, also:")
        for step in plan.purge_steps():
            output.line(f"  - {step}")
    for note in plan.kept:
        output.line(f"  kept: {note}")
    if dry_run:
        output.line("Nothing was changed (--dry-run).")
        return
    if not steps:
        return
    if not yes and not typer.confirm("Go ahead?"):
        raise typer.Exit(code=1)
    if plan.gateway_pid is not None:
        _stop(plan.gateway_pid, settings)
        output.line(f"stopped the gateway (pid {plan.gateway_pid})")
    for agent, _ in plan.undo:
        try:
            output.line(f"{agent}: {setup_state.undo(agent, settings.data_dir)}")
        except SetupConflict as exc:  # changed since the plan: nothing is purged
            raise UserError(f"cannot undo `lore setup {agent}`: {exc}; the data dir is "
                            "kept") from None
    if purge and plan.data_dir is not None:
        shutil.rmtree(plan.data_dir)
        output.line(f"removed {plan.data_dir}")
    output.line("lore is uninstalled; `pip uninstall lore-gateway` removes the program too.")


def _stop(pid: int, settings: Settings) -> None:
    """SIGTERM, then wait while it drains (``lore serve`` gives open responses
    LORE_SHUTDOWN_GRACE seconds, then flushes its storage queue)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        raise UserError(f"not allowed to stop the gateway (pid {pid}): it runs as another "
                        "user; stop it there, then run this again") from None
    limit = max(STOP_TIMEOUT_S, settings.shutdown_grace + 5)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if probe_health(settings.base_url, timeout=STOP_POLL_S) is None and _gone(pid):
            return
        time.sleep(STOP_POLL_S)
    raise UserError(f"the gateway (pid {pid}) did not stop within {limit:.0f} s; stop it, "
                    "then run this again (nothing else was changed)")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie of another parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
