"""MCP clients that start ``lore mcp`` from a JSON file: Cursor, Claude Desktop, Windsurf.

Each documents one file of the same shape, ``{"mcpServers": {name: {"command",
"args", "env"}}}``, and starts every server listed there over stdio:

* Cursor: ``~/.cursor/mcp.json`` (every project; a project's own is
  ``.cursor/mcp.json``);
* Claude Desktop: ``claude_desktop_config.json`` in ``~/Library/Application
  Support/Claude`` (macOS), ``%APPDATA%\\Claude`` (Windows), ``~/.config/Claude``
  (Linux builds);
* Windsurf: ``~/.codeium/windsurf/mcp_config.json``.

``lore setup <client>`` adds one server, ``lore``, that runs this installation's
``lore mcp``; ``agents/setup_state.py`` keeps the backup and the exact undo. An
IDE starts servers with its own environment, not the shell's, so the settings
that say which memory to open (``LORE_DATA_DIR``, ``LORE_TENANCY``,
``LORE_CONFIG``, and in team mode the gateway key) go into the entry's ``env``
when they are set where ``lore setup`` runs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.agents.codex import GATEWAY_KEY_ENV, SetupConflict

CLIENTS = ("cursor", "claude-desktop", "windsurf")
SERVER_NAME = "lore"
# What decides the memory `lore mcp` opens, passed on when set (see the docstring).
# LORE_DATABASE_URL is not: it may hold a password, and config.toml is read anyway.
PASSED_SETTINGS = ("LORE_DATA_DIR", "LORE_TENANCY", "LORE_CONFIG")
# The project `lore mcp` defaults to (cli/mcp_cmd.py), where the client fills in the
# open workspace: Cursor expands ${workspaceFolder} in its config. The others start
# servers in a directory of their own, so their calls name the project.
PROJECT_ENV = "LORE_MCP_PROJECT"
WORKSPACE_VARIABLES = {"cursor": "${workspaceFolder}"}


def config_path(client: str, env: Mapping[str, str], platform: str = sys.platform) -> Path:
    """The file ``client`` reads its MCP servers from."""
    home = Path(env.get("HOME") or Path.home())
    if client == "cursor":
        return home / ".cursor" / "mcp.json"
    if client == "windsurf":
        return home / ".codeium" / "windsurf" / "mcp_config.json"
    if client == "claude-desktop":
        if platform == "darwin":
            folder = home / "Library" / "Application Support" / "Claude"
        elif platform == "win32":
            folder = Path(env.get("APPDATA") or home / "AppData" / "Roaming") / "Claude"
        else:
            folder = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "Claude"
        return folder / "claude_desktop_config.json"
    raise ValueError(f"unknown MCP client {client!r}: expected one of {', '.join(CLIENTS)}")


def lore_command() -> list[str]:
    """This installation's ``lore mcp``, by absolute path: an IDE's PATH is not the
    shell's, and the venv's ``lore`` may be on neither."""
    script = Path(sys.executable).parent / ("lore.exe" if os.name == "nt" else "lore")
    if script.exists():
        return [str(script), "mcp"]
    return [sys.executable, "-m", "lore_gateway", "mcp"]


def server_entry(client: str, env: Mapping[str, str],
                 gateway_key: str | None) -> dict[str, Any]:
    """The ``mcpServers.lore`` value: the command, and the settings it needs."""
    command, *args = lore_command()
    passed = {name: env[name] for name in PASSED_SETTINGS if env.get(name)}
    if client in WORKSPACE_VARIABLES:
        passed[PROJECT_ENV] = WORKSPACE_VARIABLES[client]
    if gateway_key is not None:
        passed[GATEWAY_KEY_ENV] = gateway_key
    entry: dict[str, Any] = {"command": command, "args": args}
    if passed:
        entry["env"] = passed
    return entry


@dataclass(frozen=True, slots=True)
class ServerEdit:
    """What ``apply_setup`` changed: the entry it wrote and the one it replaced."""

    entry: dict[str, Any]
    previous: dict[str, Any] | None
    created_servers: bool  # the file had no "mcpServers" object before

    def to_json(self) -> dict[str, object]:
        return {"entry": self.entry, "previous": self.previous,
                "created_servers": self.created_servers}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerEdit:
        previous = data.get("previous")
        return cls(dict(data["entry"]), None if previous is None else dict(previous),
                   bool(data["created_servers"]))


def _load(text: str, what: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SetupConflict(f"{what} is not valid JSON ({exc}); fix it first") from exc
    if not isinstance(data, dict):
        raise SetupConflict(f"{what} is not a JSON object; fix it first")
    servers = data.get("mcpServers")
    if servers is not None and not isinstance(servers, dict):
        raise SetupConflict(f'"mcpServers" in {what} is not an object; fix it first')
    return data


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def apply_setup(text: str, entry: dict[str, Any], what: str) -> tuple[str, ServerEdit]:
    """Add (or replace) the ``lore`` server in the client's config text."""
    data = _load(text, what)
    servers = data.get("mcpServers")
    created = servers is None
    servers = {} if servers is None else servers
    previous = servers.get(SERVER_NAME)
    servers[SERVER_NAME] = entry
    data["mcpServers"] = servers
    return _dump(data), ServerEdit(entry, previous if isinstance(previous, dict) else None,
                                   created)


def revert_setup(text: str, edit: ServerEdit, what: str) -> str:
    """Take the ``lore`` server back out of config text the user changed since
    setup, keeping their other changes; refuse if they changed lore's entry."""
    data = _load(text, what)
    servers = data.get("mcpServers")
    if not isinstance(servers, dict) or servers.get(SERVER_NAME) != edit.entry:
        raise SetupConflict(f'mcpServers.{SERVER_NAME} is no longer the entry lore wrote')
    if edit.previous is None:
        del servers[SERVER_NAME]
    else:
        servers[SERVER_NAME] = edit.previous
    if edit.created_servers and not servers:
        del data["mcpServers"]
    return _dump(data)


def has_server(text: str) -> bool:
    """Whether the config starts a ``lore mcp`` under the name ``lore``."""
    try:
        data = _load(text, "the config")
    except SetupConflict:
        return False
    entry = (data.get("mcpServers") or {}).get(SERVER_NAME)
    return isinstance(entry, dict) and "mcp" in [str(a) for a in entry.get("args", [])]
