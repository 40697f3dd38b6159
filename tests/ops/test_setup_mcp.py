"""`lore setup cursor|claude-desktop|windsurf`: the client's MCP config gets a `lore mcp`
server, `--undo` gives the file back byte for byte, and the entry written really
starts the memory's MCP server (the official SDK's client lists its tools)."""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from typer.testing import CliRunner

from lore_gateway.cli import setup as _setup_cli  # noqa: F401  (attaches the command)
from lore_gateway.cli import uninstall as _uninstall_cli  # noqa: F401
from lore_gateway.cli.main import app
from lore_gateway.cli.mcp_cmd import default_project

CURSOR_CONFIG = (b'{\n  "mcpServers": {\n    "github": {"command": "npx", "args": ["-y", '
                 b'"@modelcontextprotocol/server-github"]}\n  },\n  "note": "mine"\n}')


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "LORE_DATA_DIR": str(tmp_path / "data"),
            "LORE_PORT": "43210", "LORE_EMBEDDINGS": "false"}


def lore(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.output


def cursor_config(env: dict[str, str]) -> Path:
    return Path(env["HOME"]) / ".cursor" / "mcp.json"


@pytest.mark.parametrize("original", [CURSOR_CONFIG, None])
def test_cursor_setup_then_undo_is_byte_identical(env: dict[str, str],
                                                  original: bytes | None) -> None:
    path = cursor_config(env)
    if original is not None:
        path.parent.mkdir(parents=True)
        path.write_bytes(original)

    code, out = lore(env, "setup", "cursor")
    assert code == 0, out
    assert "MCP server" in out and "lore setup --undo cursor" in out
    written = json.loads(path.read_text())
    entry = written["mcpServers"]["lore"]
    assert entry["args"][-1] == "mcp" and Path(entry["command"]).is_absolute()
    assert entry["env"]["LORE_DATA_DIR"] == env["LORE_DATA_DIR"]
    if original is not None:  # the user's own servers and keys are kept
        assert written["mcpServers"]["github"]["command"] == "npx"
        assert written["note"] == "mine"

    code, out = lore(env, "setup", "--status", "--json")
    assert code == 0 and json.loads(out)["agents"]["cursor"]["points_at_gateway"] is True
    code, out = lore(env, "setup", "--status")  # listed, now that it has lore's server
    assert code == 0 and "cursor" in out and "windsurf" not in out
    code, out = lore(env, "uninstall", "--dry-run")  # `lore uninstall` would undo it too
    assert code == 0 and f"cursor: {'restore' if original else 'remove'} {path}" in out

    code, out = lore(env, "setup", "--undo", "cursor")
    assert code == 0, out
    if original is None:
        assert not path.exists() and not path.parent.exists()
    else:
        assert path.read_bytes() == original


@pytest.mark.parametrize("expanded", [True, False])
def test_the_entry_written_starts_the_memorys_mcp_server(env: dict[str, str], tmp_path: Path,
                                                        expanded: bool) -> None:
    assert lore(env, "setup", "cursor")[0] == 0
    entry = json.loads(cursor_config(env).read_text())["mcpServers"]["lore"]
    assert entry["env"]["LORE_MCP_PROJECT"] == "${workspaceFolder}"
    # What Cursor does with it: the command, its arguments, its env over Cursor's own,
    # with the open workspace filled in (or, by a client that does not, left as is).
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    entry_env = {name: value.replace("${workspaceFolder}", str(workspace)) if expanded
                 else value for name, value in entry["env"].items()}
    server = StdioServerParameters(
        command=entry["command"], args=entry["args"], cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": env["HOME"],
             "LORE_EMBEDDINGS": "false", **entry_env})

    async def talk() -> tuple[set[str], str]:
        async with Client(server) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            added = await client.call_tool("knowledge", {
                "action": "add", "title": "Tabs", "content": "We indent with tabs."})
            return names, "".join(getattr(part, "text", "") for part in added.content)

    # On a thread of its own: a loop left running on this one (Playwright's) must not matter.
    with ThreadPoolExecutor(1) as pool:
        names, added = pool.submit(asyncio.run, asyncio.wait_for(talk(), 60)).result()
    assert names == {"recall", "search_sessions", "get_message", "knowledge"}
    # The entry lands in the workspace's project; unexpanded, in the working directory's.
    assert f"for {workspace if expanded else tmp_path};" in added


def test_claude_desktop_undo_keeps_servers_added_since(env: dict[str, str]) -> None:
    path = Path(env["HOME"]) / ".config" / "Claude" / "claude_desktop_config.json"  # Linux
    assert lore(env, "setup", "claude-desktop")[0] == 0
    config = json.loads(path.read_text())
    config["mcpServers"]["notes"] = {"command": "notes-mcp"}
    path.write_text(json.dumps(config))

    code, out = lore(env, "setup", "--undo", "claude-desktop")
    assert code == 0, out
    assert json.loads(path.read_text()) == {"mcpServers": {"notes": {"command": "notes-mcp"}}}


def test_print_shows_the_entry_and_team_mode_carries_the_key(env: dict[str, str]) -> None:
    team = {**env, "LORE_TENANCY": "keys", "LORE_KEY": "lore_k_example"}
    code, out = lore(team, "setup", "--print", "windsurf")
    assert code == 0, out
    entry = json.loads(out)["mcpServers"]["lore"]
    assert entry["env"]["LORE_KEY"] == "lore_k_example"
    assert entry["env"]["LORE_TENANCY"] == "keys"
    assert not (Path(env["HOME"]) / ".codeium").exists()  # printed, not written

    code, out = lore(env, "setup", "--print", "codex")
    assert code == 2 and "--print is for MCP clients" in out


def test_the_default_project_is_never_a_launchers_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert default_project(str(tmp_path / "a" / ".."), "/", home) == str(tmp_path)
    assert default_project(None, str(tmp_path), home) == str(tmp_path)
    assert default_project("${workspaceFolder}", str(tmp_path), home) == str(tmp_path)
    assert default_project(None, "/", home) is None  # Claude Desktop starts servers in /
    assert default_project("${workspaceFolder}", str(home), home) is None
