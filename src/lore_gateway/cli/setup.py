"""``lore setup codex|claude|opencode|gemini|cursor|claude-desktop|windsurf``, ``lore
setup --undo <agent>``, ``lore setup --status``.

Codex, Claude Code, OpenCode and Gemini CLI are pointed at the gateway; the MCP clients get
``lore mcp`` as a server in the file they read (``agents/mcp_clients.py``).
"""

from __future__ import annotations

import json
import os

import typer
from rich.console import Console

from lore_gateway.agents import gemini, mcp_clients, opencode, setup_state
from lore_gateway.agents.codex import SetupConflict
from lore_gateway.cli import output, preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.run import gateway_key
from lore_gateway.config import Settings


@app.command("setup")
def setup_command(
    agent: str | None = typer.Argument(None, help=", ".join(setup_state.TARGETS)),
    undo: bool = typer.Option(False, "--undo", help="Restore the agent's config from the backup."),
    status: bool = typer.Option(False, "--status", help="Show which agents point at lore."),
    as_json: bool = typer.Option(False, "--json", help="With --status: print one JSON object."),
    show: bool = typer.Option(False, "--print", help="OpenCode, Gemini CLI and MCP clients: "
                              "print the config entry instead of writing it (for a client "
                              "lore does not write, a project's opencode.json or .env)."),
) -> None:
    """Point an agent at the gateway permanently (with a backup), or undo it exactly.

    For Claude Code this also sets DISABLE_AUTO_COMPACT=1 in settings.json (unless
    you set it): the gateway manages the context and answers /compact from memory.
    OpenCode's Anthropic and OpenAI providers get the gateway as their base URL in
    ~/.config/opencode/opencode.json (or .jsonc; its comments are kept).
    Gemini CLI gets GOOGLE_GEMINI_BASE_URL in ~/.gemini/.env (it must sign in
    with a Gemini API key).
    Cursor, Claude Desktop and Windsurf get the memory as an MCP server (`lore mcp`).
    """
    settings = preflight.settings()
    console = Console()
    if status:
        _print_status(settings, as_json)
        return
    if agent not in setup_state.TARGETS:
        raise typer.BadParameter(
            f"name an agent: {', '.join(setup_state.TARGETS)}", param_hint="AGENT"
        )
    if show and agent == "opencode":
        config = opencode.provider_config(settings.base_url, gateway_key(settings, os.environ))
        typer.echo(json.dumps(config, indent=2))
        return
    if show and agent == "gemini":
        text, _ = gemini.apply_setup("", settings.base_url, gateway_key(settings, os.environ))
        typer.echo(text, nl=False)
        return
    if show:
        if agent not in mcp_clients.CLIENTS:
            raise typer.BadParameter(
                f"--print is for MCP clients ({', '.join(mcp_clients.CLIENTS)}), opencode "
                "and gemini",
                param_hint="--print")
        entry = mcp_clients.server_entry(agent, os.environ, gateway_key(settings, os.environ))
        typer.echo(json.dumps({"mcpServers": {mcp_clients.SERVER_NAME: entry}}, indent=2))
        return
    try:
        if undo:
            console.print(setup_state.undo(agent, settings.data_dir))
        else:
            key = gateway_key(settings, os.environ)
            path = setup_state.setup(agent, settings.data_dir, settings.base_url,
                                     gateway_key=key)
            if agent in mcp_clients.CLIENTS:
                note = "" if key is None else " Your gateway key is stored there (env LORE_KEY)."
                console.print(
                    f"{agent} now starts lore's memory as an MCP server (`lore mcp`, {path})."
                    f"{note} Restart {agent} to load it. Undo with `lore setup --undo {agent}`.",
                    highlight=False)
                return
            note = "" if key is None else " Your gateway key is stored there as a header."
            if agent == "claude":
                note += (" Its auto-compaction is off (DISABLE_AUTO_COMPACT=1, unless you set"
                         " it): the gateway manages the context and answers /compact.")
            if agent == "opencode":
                note += (" Its anthropic and openai providers go through it (a project's"
                         " opencode.json that sets their baseURL still wins).")
            if agent == "gemini":
                note += (" Sign it in with a Gemini API key (GEMINI_API_KEY); a project's own"
                         " .env shadows this one.")
            console.print(
                f"{agent} now uses lore at {settings.base_url} ({path}).{note} "
                f"Undo with `lore setup --undo {agent}`."
            )
    except (SetupConflict, RuntimeError) as exc:
        typer.echo(f"lore setup: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_status(settings: Settings, as_json: bool) -> None:
    states = {agent: setup_state.status(agent, settings.data_dir, settings.base_url)
              for agent in setup_state.TARGETS}
    if as_json:
        output.print_json({"gateway": settings.base_url, "agents": {
            agent: {"config": str(s.path), "exists": s.exists, "set_up_by_lore": s.set_up_by_lore,
                    "points_at_gateway": s.points_at_gateway} for agent, s in states.items()}})
        return
    # A client the user does not have is noise in the table: OpenCode and Gemini CLI
    # are listed once their config folder exists, an MCP client once its config file exists, either
    # once lore set it up (--json lists every one).
    shown = {agent: s for agent, s in states.items()
             if agent in ("codex", "claude") or s.exists or s.set_up_by_lore
             or (agent in ("opencode", "gemini") and s.path.parent.is_dir())}
    output.print_table(
        [output.Column("agent", wrap=False), output.Column("config"),
         output.Column("set up by lore", wrap=True), output.Column("points at gateway")],
        [(agent, str(s.path) if s.exists else f"{s.path} (absent)",
          "yes" if s.set_up_by_lore else "no", "yes" if s.points_at_gateway else "no")
         for agent, s in shown.items()],
        title=f"agents and lore at {settings.base_url}")
