"""``lore mcp``: the memory as an MCP server over stdio, for IDE agents.

An IDE (Cursor, Claude Desktop, Windsurf, ...) starts this command and speaks MCP
on its stdin and stdout (``lore setup cursor`` writes the config that does it).
It opens the memory the way the other memory commands do (``cli/scope.py``
decides the tenant: the one memory in personal mode, ``LORE_KEY``'s or
``--tenant`` in team mode) and serves the tools of ``mcp_server/tools.py``.
stdout belongs to the protocol: logging goes to stderr, which IDEs show in their
MCP log.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import typer

from lore_gateway.agents.mcp_clients import PROJECT_ENV
from lore_gateway.cli import preflight
from lore_gateway.cli.main import app
from lore_gateway.cli.scope import KeyEnvOpt, TenantOpt, resolve_tenant

log = logging.getLogger("lore.mcp")



@app.command("mcp")
def mcp_command(
    project: str = typer.Option(None, "--project", envvar=PROJECT_ENV,
                                help="The project tools mean when a call names none "
                                "(default: the working directory)."),
    tenant: str = TenantOpt, key_env: str = KeyEnvOpt,
) -> None:
    """Serve the memory over MCP on stdin/stdout (for Cursor, Claude Desktop, ...)."""
    from lore_gateway.obs.logging import configure_logging

    settings = preflight.settings()
    configure_logging(settings.log_level, settings.log_format)  # stderr only
    preflight.require_data_dir(settings)
    from lore_gateway.mcp_server import server
    from lore_gateway.mcp_server.tools import Caller, MemoryTools
    from lore_gateway.memory.service import Memory
    from lore_gateway.recall.core.executor import SearchGate

    # Searches run on this process's search thread: one IDE's calls do not need
    # the gateway's search children, and nothing but the query is embedded here.
    memory = Memory.open(settings.model_copy(update={"search_process": False}),
                         embedder="auto", embed_backlog=False)
    try:
        chosen = resolve_tenant(memory, tenant, key_env, False)
        assert chosen is not None
        caller = Caller(chosen, default_project(project, os.getcwd(), Path.home()))

        async def caller_of(_ctx: object) -> Caller:
            return caller

        tools = MemoryTools(memory, export=settings.export,
                            gate=SearchGate(timeout=settings.search_timeout))
        asyncio.run(server.build(tools, caller_of).run_stdio_async())
    finally:
        memory.close()


def default_project(named: str | None, cwd: str, home: Path) -> str | None:
    """The project a call means when it names none: ``--project`` (or
    ``LORE_MCP_PROJECT``), else the working directory. Neither counts when it is no
    project: a variable the IDE left unexpanded (``${workspaceFolder}``), or the
    filesystem root or home directory an IDE starts servers in; tools then ask for
    a project where they need one."""
    if named and "${" not in named:
        return str(Path(named).expanduser().resolve())
    if named:
        log.warning("lore mcp: ignoring project %r, a variable the client did not fill in",
                    named)
    here = Path(cwd)
    return None if here in (Path(here.anchor), home) else cwd
