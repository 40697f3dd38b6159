"""``lore setup codex|claude``, ``lore setup --undo <agent>``, ``lore setup --status``."""

from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.table import Table

from lore_gateway.agents import setup_state
from lore_gateway.agents.codex import SetupConflict
from lore_gateway.cli.main import app
from lore_gateway.cli.run import gateway_key
from lore_gateway.config import Settings


@app.command("setup")
def setup_command(
    agent: str | None = typer.Argument(None, help="codex or claude"),
    undo: bool = typer.Option(False, "--undo", help="Restore the agent's config from the backup."),
    status: bool = typer.Option(False, "--status", help="Show which agents point at lore."),
) -> None:
    """Point an agent at the gateway permanently (with a backup), or undo it exactly."""
    settings = Settings()
    console = Console()
    if status:
        _print_status(console, settings)
        return
    if agent not in setup_state.AGENTS:
        raise typer.BadParameter(
            f"name an agent: {' or '.join(setup_state.AGENTS)}", param_hint="AGENT"
        )
    try:
        if undo:
            console.print(setup_state.undo(agent, settings.data_dir))
        else:
            key = gateway_key(settings, os.environ)
            path = setup_state.setup(agent, settings.data_dir, settings.base_url,
                                     gateway_key=key)
            note = "" if key is None else " Your gateway key is stored there as a header."
            console.print(
                f"{agent} now uses lore at {settings.base_url} ({path}).{note} "
                f"Undo with `lore setup --undo {agent}`."
            )
    except (SetupConflict, RuntimeError) as exc:
        typer.echo(f"lore setup: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_status(console: Console, settings: Settings) -> None:
    table = Table(title=f"agents and lore at {settings.base_url}")
    for column in ("agent", "config", "set up by lore", "points at gateway"):
        table.add_column(column)
    for agent in setup_state.AGENTS:
        state = setup_state.status(agent, settings.data_dir, settings.base_url)
        config = str(state.path) if state.exists else f"{state.path} (absent)"
        table.add_row(
            agent, config, "yes" if state.set_up_by_lore else "no",
            "yes" if state.points_at_gateway else "no",
        )
    console.print(table)
