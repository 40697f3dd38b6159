"""The fake upstream's recall scenarios: answers that call the hidden ``recall``
tool, alone or among visible tool calls, per provider shape."""

from __future__ import annotations

import orjson

from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_streams import Answer

RECALL_SCENARIOS = ("recall", "call-recall", "thinking-recall", "thinking-call-recall",
                    "recall-first", "recall-between", "parallel-recall", "text-recall")
# Scenarios that call recall even when the request ends with a tool output (an
# agent's tool loop), so a scripted recall can land mid-turn.
ALWAYS_CALL = ("call-recall", "thinking-call-recall")
_VISIBLE_TOOL = ("read_file", '{"path":"README.md"}')
TEXT_RECALL_PREAMBLE = "Let me look that up."


def recall_call(api: str, name: str, arguments: str, model: str, chat_usage: bool) -> Answer:
    """The answer of a recall scenario that calls the tool."""
    recall = (fs.RECALL_TOOL, arguments)
    if api == "chat":
        if name == "recall-between":
            return fs.chat_calls((_VISIBLE_TOOL, recall, _VISIBLE_TOOL), model, chat_usage)
        return fs.chat_call(fs.RECALL_TOOL, arguments, model, chat_usage)
    if api == "responses":
        if name == "recall-between":
            return fs.responses_calls((_VISIBLE_TOOL, recall, _VISIBLE_TOOL), model)
        if name == "text-recall":
            return fs.responses_calls((recall,), model, preamble=TEXT_RECALL_PREAMBLE)
        if name == "parallel-recall":
            second = orjson.dumps({"query": "a second search"}).decode()
            return fs.responses_calls((recall, (fs.RECALL_TOOL, second)), model)
        return fs.responses_call(fs.RECALL_TOOL, arguments, model)
    call = ("tool_use", fs.RECALL_TOOL, arguments)
    if name in ("thinking-recall", "thinking-call-recall"):
        return fs.anthropic_blocks((("thinking", "The user wants a stored fact.", ""),
                                    ("text", "Let me look that up.", ""), call), model)
    if name == "recall-first":
        return fs.anthropic_blocks((call,), model)
    if name == "recall-between":
        read = ("tool_use", *_VISIBLE_TOOL)
        return fs.anthropic_blocks((("text", "Checking.", ""), read, call,
                                    ("tool_use", "read_file", '{"path":"docs/a.md"}')), model)
    return fs.anthropic_call(fs.RECALL_TOOL, arguments, model)
