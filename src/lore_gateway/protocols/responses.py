"""OpenAI Responses (public API and the ChatGPT Codex backend): requests and turns.

The stream accumulator lives in :mod:`responses_stream` and the stream
synthesiser in :mod:`responses_synth`; both are re-exported here so callers
import one module per protocol.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.protocols.common import Message, ToolCall, content_text
from lore_gateway.protocols.responses_model import Mode, ResponsesResult
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.protocols.responses_synth import stream_from_response

__all__ = [
    "Mode",
    "ResponsesAccumulator",
    "ResponsesResult",
    "ToolCall",
    "items_messages",
    "new_input_messages",
    "output_messages",
    "stream_from_response",
]

RECALL_TOOL_NAME = "recall"


# Codex CLI sends these as ``role: user`` messages, but they are context it
# injected (working directory, AGENTS.md, skills), not what the user typed;
# storing them would flood memory with the same boilerplate every turn.
_INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<skills_instructions>",
    "<permissions instructions>",
    "# AGENTS.md instructions",
)
# Item types the client sends back that the model produced on an earlier turn.
_USER_SIDE_TYPES = frozenset({"message", "item_reference"})


def _is_assistant_item(item: dict[str, Any]) -> bool:
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return not (kind in _USER_SIDE_TYPES or str(kind).endswith("_output"))


def new_input_messages(body: dict[str, Any]) -> list[Message]:
    """The user-side items this turn added: everything after the last item the
    model produced (assistant message, function call, reasoning, ...).

    User messages become ``user`` text; ``*_output`` items become ``tool``
    messages ``[tool:<call_id>] <output>``. Developer/system messages and
    Codex's injected context blocks are skipped.
    """
    inp = body.get("input")
    if isinstance(inp, str):
        return [Message("user", inp)] if inp else []
    if not isinstance(inp, list):
        return []
    items = [i for i in inp if isinstance(i, dict)]
    start = 0
    for pos, item in enumerate(items):
        if _is_assistant_item(item):
            start = pos + 1
    out: list[Message] = []
    for item in items[start:]:
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            text = content_text(item.get("content"))
            if text and not text.lstrip().startswith(_INJECTED_PREFIXES):
                out.append(Message("user", text))
        elif str(kind).endswith("_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output)
            out.append(Message("tool", f"[tool:{item.get('call_id', '')}] {text}"))
    return out


def output_messages(acc: ResponsesAccumulator | ResponsesResult) -> list[Message]:
    """The assistant's complete output, in output order. Reasoning appears only
    as its readable summary; encrypted content is never stored."""
    result = acc.result() if isinstance(acc, ResponsesAccumulator) else acc
    return items_messages(result.output)


def items_messages(items: list[dict[str, Any]]) -> list[Message]:
    """Output items (messages, tool calls, reasoning) flattened for storage."""
    out: list[Message] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            text = _message_text(item.get("content"))
            if text:
                out.append(Message("assistant", text))
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments") if kind == "function_call" else item.get("input")
            out.append(Message("assistant", f"[tool_call:{item.get('name', '')}] {args or ''}"))
        elif kind == "reasoning":
            for part in item.get("summary") or []:
                if isinstance(part, dict) and part.get("text"):
                    out.append(Message("assistant", f"[reasoning] {part['text']}"))
    return out


def _message_text(content: object) -> str:
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "output_text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return "\n".join(texts)
