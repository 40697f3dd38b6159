"""Helpers of the MCP tests: the official SDK's client, over stdio and over HTTP.

``lore mcp`` is started as a child process the way an IDE starts it; the HTTP
tests talk to a real gateway's ``/mcp``. Claude-style traffic goes through the
gateway with ``tests/knowledge/kit.py`` (the fake upstream records what it got).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "knowledge"))
from kit import AnthropicSession, agent_requests, git_project

from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.testing import FakeUpstream, wait_until_stored

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
TOOLS = {"recall", "search_sessions", "get_message", "knowledge"}
REF = re.compile(r"\bt:(\d+)\b")
# A `lore mcp` child: Python start, imports, opening the memory.
CALL_TIMEOUT_S = 60.0

__all__ = ["BLOCK_HEADING", "AnthropicSession", "agent_requests", "git_project"]


def run(work: Callable[[], Awaitable[T]]) -> T:
    """Run one async client conversation from a synchronous test, bounded in time, on
    a thread of its own: an event loop another fixture keeps running on the test's
    thread (Playwright's sync API, in tests/ui) must not matter."""
    async def bounded() -> T:
        return await asyncio.wait_for(work(), CALL_TIMEOUT_S)
    with ThreadPoolExecutor(1, thread_name_prefix="mcp-client") as pool:
        return pool.submit(asyncio.run, bounded()).result()


def stdio_env(data_dir: Path, home: Path, **extra: str) -> dict[str, str]:
    """What an IDE would give ``lore mcp``: a bare environment naming the memory."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "PYTHONPATH": str(REPO / "src"), "LORE_CONFIG": os.devnull,
           "LORE_DATA_DIR": str(data_dir), "LORE_EMBEDDINGS": "false", **extra}
    if "LORE_DATABASE_URL" in os.environ:  # the backend suites' Postgres (tests/conftest.py)
        env["LORE_DATABASE_URL"] = os.environ["LORE_DATABASE_URL"]
    return env


def stdio_server(env: dict[str, str], cwd: Path, *args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "lore_gateway", "mcp", *args], env=env, cwd=cwd)


def http_server(url: str, headers: dict[str, str] | None = None) -> Any:
    """The streamable-HTTP transport to ``url`` with ``headers`` on every request."""
    return streamable_http_client(url, http_client=httpx2.AsyncClient(
        headers=headers or {}, timeout=CALL_TIMEOUT_S))


async def text_of(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """The tool's text; fails the test when the tool answered with an error."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(part, "text", "") for part in result.content)
    assert not result.is_error, text
    return text


async def error_of(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    """The tool's error text; fails the test when the call succeeded."""
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(part, "text", "") for part in result.content)
    assert result.is_error, text
    return text


async def tool_names(client: Client) -> set[str]:
    return {tool.name for tool in (await client.list_tools()).tools}


def remember(gw: Any, project: Path, session: str, fact: str, *,
             headers: dict[str, str] | None = None, tenant: str | None = None) -> None:
    """One Claude-style turn stating ``fact``, stored before this returns."""
    AnthropicSession(gw, project, session).say(f"{fact} Please remember it.", headers=headers)
    wait_until_stored(gw, fact, tenant=tenant)


def knowledge_block_of_next_session(gw: Any, fake: FakeUpstream, project: Path, session: str,
                                    *, headers: dict[str, str] | None = None) -> str:
    """The system prompt the upstream got for a new session's first request."""
    fake.reset()
    AnthropicSession(gw, project, session).say("What do we know about this project?",
                                               headers=headers)
    (opening,) = agent_requests(fake)
    system = opening.json["system"]
    assert isinstance(system, str)
    return system
