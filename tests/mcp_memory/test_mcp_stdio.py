"""``lore mcp`` over stdio, driven by the official MCP SDK's client as an IDE would.

The memory is filled by Claude-style traffic through a real gateway (the fake
upstream plays the provider); ``lore mcp`` is a child process opening the same
data dir, started in the project's directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_kit import (
    BLOCK_HEADING,
    REF,
    TOOLS,
    error_of,
    git_project,
    knowledge_block_of_next_session,
    remember,
    run,
    stdio_env,
    stdio_server,
    text_of,
    tool_names,
)

from lore_gateway.testing import FakeUpstream

pytestmark = pytest.mark.both_backends

FACT = "The staging deploy key lives in the vault path secret/zephyr-42."
QUERY = "staging deploy key vault zephyr"
RULE = "Release builds are signed with the hardware key in the Lisbon office, never a CI key."


def test_lists_the_tools_recalls_a_fact_and_opens_its_message(
        make_gateway: Any, tmp_path: Path) -> None:
    gw = make_gateway()
    project = git_project(tmp_path / "repo").resolve()
    remember(gw, project, "claude-one", FACT)
    server = stdio_server(stdio_env(gw.settings.data_dir, tmp_path / "home"), project)

    async def talk() -> tuple[set[str], str, str, str, str]:
        async with Client(server) as client:
            names = await tool_names(client)
            found = await text_of(client, "recall", {"query": QUERY})
            here = await text_of(client, "recall", {"query": QUERY, "scope": "project"})
            ref = next(f"t:{m}" for m in REF.findall(found))
            message = await text_of(client, "get_message", {"ref": ref, "neighbours": 1})
            sessions = await text_of(client, "search_sessions", {"text": "zephyr"})
            return names, found, here, message, sessions

    names, found, here, message, sessions = run(talk)
    assert names == TOOLS
    assert "secret/zephyr-42" in found and "secret/zephyr-42" in here
    # The hidden recall tool's rendering: tiers and references.
    assert found.startswith("## ") and REF.search(found)
    assert "secret/zephyr-42" in message and "session claude-one" in message
    assert f"project {project}" in message and "### After" in message  # the answer
    assert "claude-one" in sessions and str(project) in sessions and "zephyr-42" in sessions


def test_an_entry_added_over_mcp_is_in_the_next_claude_code_session(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = make_gateway()
    project = git_project(tmp_path / "repo").resolve()
    server = stdio_server(stdio_env(gw.settings.data_dir, tmp_path / "home"), project)

    async def add() -> tuple[str, str, str]:
        async with Client(server, mode="legacy") as client:  # today's IDEs: the handshake
            added = await text_of(client, "knowledge", {
                "action": "add", "title": "Release signing", "content": RULE,
                "category": "gotcha"})
            listed = await text_of(client, "knowledge", {"action": "list"})
            problem = await error_of(client, "knowledge", {"action": "add", "title": "x"})
            return added, listed, problem

    added, listed, problem = run(add)
    assert added.startswith("added [gotcha] Release signing")
    assert "Lisbon office" in listed and str(project) in listed
    assert problem == "Error executing tool knowledge: add needs a title and content"
    system = knowledge_block_of_next_session(gw, fake_upstream, project, "claude-two")
    assert BLOCK_HEADING in system and RULE in system
    assert RULE in (project / ".lore.md").read_text()  # the file follows, as for /ui


def test_an_entry_edited_over_mcp_keeps_its_id(make_gateway: Any, tmp_path: Path) -> None:
    gw = make_gateway()
    project = git_project(tmp_path / "repo").resolve()
    server = stdio_server(stdio_env(gw.settings.data_dir, tmp_path / "home"), project)

    async def edit() -> tuple[str, str, str]:
        async with Client(server) as client:
            added = await text_of(client, "knowledge", {
                "action": "add", "title": "Release signing", "content": RULE})
            entry_id = added.split("(id ")[1].split(")")[0]
            edited = await text_of(client, "knowledge", {
                "action": "edit", "entry_id": entry_id[:8], "content": "Signed in Porto now."})
            return entry_id, edited, await text_of(client, "knowledge", {"action": "list"})

    entry_id, edited, listed = run(edit)
    assert edited.startswith(f"updated [decision] Release signing (id {entry_id})")
    assert "Signed in Porto now." in listed and "Lisbon" not in listed
