"""The memory tools registered with the official MCP SDK (``mcp`` 2.x ``MCPServer``).

The SDK builds each tool's input schema from the signatures below (a
description per argument) and validates calls against it; ``tools.MemoryTools``
does the work. Who is calling is not the SDK's business: ``build`` takes
``caller_of``, which turns a call's context into a ``tools.Caller``: a fixed
tenant and the working directory's project for ``lore mcp``, the tenant the
gateway's ``/mcp`` resolved from the request for HTTP (``http.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from lore_gateway import __version__
from lore_gateway.knowledge.store import CATEGORIES
from lore_gateway.mcp_server.tools import (
    DEFAULT_NEIGHBOURS,
    DEFAULT_SESSIONS,
    MAX_NEIGHBOURS,
    MAX_SESSIONS,
    Caller,
    KnowledgeAction,
    MemoryTools,
    RecallScope,
    ToolProblem,
)
from lore_gateway.recall.core.tool import MAX_QUERY_CHARS

CallerOf = Callable[[Context], Awaitable[Caller]]

NAME = "lore"
INSTRUCTIONS = (
    "lore is the user's persistent memory of their coding sessions: every turn of "
    "every agent that went through the lore gateway (Claude Code, Codex, ...) and the "
    "knowledge learned per project. Recall before assuming: earlier decisions, file "
    "paths, errors and fixes may only exist in memory. Results carry references such "
    "as (t:123): get_message fetches one whole, with the messages around it. Record "
    "a lasting decision, pattern or gotcha with knowledge (action 'add'); the "
    "project's next session starts with it."
)
RECALL_DESCRIPTION = (
    "Search the user's persistent memory of past coding sessions: what was said, "
    "decided, run and found, in every session of every agent, plus distilled notes and "
    "project knowledge. Results are ranked, grouped by strength, and carry references "
    "(t:123) to pass to get_message for the full text."
)
SESSIONS_DESCRIPTION = (
    "List stored sessions, newest first: id, project, last activity, turns and the "
    "first line the user wrote. Filter by project or by text in that first line, the "
    "project or the id. To find what was said, use recall instead."
)
MESSAGE_DESCRIPTION = (
    "Fetch one stored message by its reference (t:123, from recall results) in full, "
    "with the messages before and after it in its session."
)
KNOWLEDGE_DESCRIPTION = (
    "Long-term project knowledge (decisions, patterns, preferences, architecture, "
    "gotchas), the same entries every new session of the project gets in its prompt. "
    "action 'list' shows a project's entries with their ids; 'add' records a new one "
    "(an existing entry with the same title is updated instead); 'edit' changes one "
    "by its id. Add only what will still be true and useful in later sessions."
)
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def build(tools: MemoryTools, caller_of: CallerOf) -> MCPServer:
    """An MCP server with the four memory tools, each asking ``caller_of`` who calls."""
    with _root_logging_kept():
        server: MCPServer = MCPServer(NAME, instructions=INSTRUCTIONS, version=__version__,
                                      log_level="WARNING")

    async def recall(
        query: Annotated[str, Field(description="What to look for: keywords, file names, "
                                    "error text, a decision.", max_length=MAX_QUERY_CHARS)],
        ctx: Context,
        scope: Annotated[RecallScope, Field(description="'all' (default): every project, "
                                            "this one favoured; 'project': this project "
                                            "only.")] = "all",
        project: Annotated[str | None, Field(description="The project (its absolute path) "
                                             "the search is for; default: the current "
                                             "one.")] = None,
    ) -> str:
        caller = await caller_of(ctx)
        return await _answer(tools.recall(caller, query, scope, project))

    async def search_sessions(
        ctx: Context,
        text: Annotated[str | None, Field(description="Only sessions whose first line, "
                                          "project or id contains this (any case).")] = None,
        project: Annotated[str | None, Field(description="Only this project (its absolute "
                                             "path).")] = None,
        limit: Annotated[int, Field(description="How many sessions.", ge=1,
                                    le=MAX_SESSIONS)] = DEFAULT_SESSIONS,
    ) -> str:
        caller = await caller_of(ctx)
        return await _answer(tools.search_sessions(caller, text, project, limit))

    async def get_message(
        ref: Annotated[str, Field(description="The message's reference, e.g. t:123.")],
        ctx: Context,
        neighbours: Annotated[int, Field(description="Messages shown before and after it.",
                                         ge=0, le=MAX_NEIGHBOURS)] = DEFAULT_NEIGHBOURS,
        offset: Annotated[int, Field(description="Where to start in a long message (a "
                                     "cut one says where to go on).", ge=0)] = 0,
    ) -> str:
        caller = await caller_of(ctx)
        return await _answer(tools.get_message(caller, ref, neighbours, offset))

    async def knowledge(
        ctx: Context,
        action: Annotated[KnowledgeAction, Field(description="list, add or edit.")] = "list",
        project: Annotated[str | None, Field(description="The project (its absolute path); "
                                             "default: the current one.")] = None,
        entry_id: Annotated[str | None, Field(description="edit: the entry's id (or a "
                                              "unique prefix of 4+ characters).")] = None,
        title: Annotated[str | None, Field(description="add/edit: a short title; it "
                                           "identifies the entry.")] = None,
        content: Annotated[str | None, Field(description="add/edit: the fact, in a few "
                                             "sentences.")] = None,
        category: Annotated[str | None, Field(description="add/edit: one of "
                                              f"{', '.join(CATEGORIES)} (add: default "
                                              "decision).")] = None,
        cross_project: Annotated[bool | None, Field(description="add/edit: true for the "
                                                    "user's own habit, shown in every "
                                                    "project.")] = None,
    ) -> str:
        caller = await caller_of(ctx)
        return await _answer(tools.knowledge(caller, action, project, entry_id, title,
                                             content, category, cross_project))

    server.add_tool(recall, description=RECALL_DESCRIPTION, annotations=_READ_ONLY,
                    structured_output=False)
    server.add_tool(search_sessions, description=SESSIONS_DESCRIPTION, annotations=_READ_ONLY,
                    structured_output=False)
    server.add_tool(get_message, description=MESSAGE_DESCRIPTION, annotations=_READ_ONLY,
                    structured_output=False)
    server.add_tool(knowledge, description=KNOWLEDGE_DESCRIPTION,
                    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                                open_world_hint=False),
                    structured_output=False)
    return server


async def _answer(work: Awaitable[str]) -> str:
    """The tool's text; a ``ToolProblem`` becomes the SDK's tool error (the agent
    reads the line, marked as an error, and the session goes on)."""
    try:
        return await work
    except ToolProblem as exc:
        raise ToolError(str(exc)) from None


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    """``MCPServer()`` calls ``logging.basicConfig`` (a rich handler at INFO) when the
    root logger has no handler yet; logging is ``obs/logging.py``'s to configure, in
    the gateway and in ``lore mcp`` alike, so whatever it did is undone. The SDK's
    own per-request INFO lines are kept out unless lore logs at debug."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        if level != logging.DEBUG:
            logging.getLogger("mcp").setLevel(logging.WARNING)
