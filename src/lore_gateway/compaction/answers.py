"""A compaction answered in the exact shape each agent expects (pure).

* Claude Code: an assistant message whose text is ``<analysis>…</analysis>``
  then ``<summary>…</summary>`` (it keeps what is inside ``<summary>``),
  streamed as named Messages events or as one JSON message.
* Codex local compaction: a Responses message holding the summary.
* Codex ``compaction_trigger``: exactly one ``compaction`` output item whose
  ``encrypted_content`` is our own handle (we cannot forge OpenAI's). The
  handle carries the summary itself, so expanding it needs no lookup and gives
  the same bytes on every later request (the prompt cache keeps hitting).
* Codex ``/responses/compact``: ``{output: [items]}``, the new history.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from typing import Any

import orjson

from lore_gateway.protocols import anthropic
from lore_gateway.protocols.responses_synth import stream_from_response

HANDLE_PREFIX = "lore-compaction:v1:"
EXPANDED_INTRO = ("[lore-gateway] The conversation before this point was compacted. This is "
                  "the gateway's summary of it, from memory; use `recall` for details.")
CLAUDE_ANALYSIS = ("<analysis>\nAssembled by lore-gateway from its memory of this session "
                   "(distillations, recent turns and project knowledge).\n</analysis>")


def _id(prefix: str, text: str) -> str:
    return prefix + hashlib.sha256(text.encode()).hexdigest()[:24]


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


# --- Claude Code ----------------------------------------------------------------


def claude_text(summary: str) -> str:
    return f"{CLAUDE_ANALYSIS}\n\n<summary>\n{summary}\n</summary>"


def anthropic_message(summary: str, model: str) -> dict[str, Any]:
    text = claude_text(summary)
    return {
        "id": _id("msg_lore_", text), "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": _tokens(text)},
    }


def anthropic_answer(summary: str, model: str, stream: bool) -> bytes:
    message = anthropic_message(summary, model)
    if not stream:
        return orjson.dumps(message)
    return b"".join(anthropic.stream_from_response(message))


# --- Codex ------------------------------------------------------------------------


def _response(rid: str, model: str, output: list[dict[str, Any]],
              out_tokens: int) -> dict[str, Any]:
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
        "error": None, "incomplete_details": None, "model": model, "output": output,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": out_tokens},
    }


def summary_message_item(summary: str) -> dict[str, Any]:
    return {"type": "message", "id": _id("msg_lore_", summary), "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": summary, "annotations": []}]}


def responses_summary_answer(summary: str, model: str, stream: bool) -> bytes:
    """Codex local compaction: one assistant message with the summary."""
    response = _response(_id("resp_lore_", summary), model, [summary_message_item(summary)],
                         _tokens(summary))
    if not stream:
        return orjson.dumps(response)
    return b"".join(stream_from_response(response))


def handle(summary: str) -> str:
    return HANDLE_PREFIX + base64.b64encode(summary.encode()).decode()


def compaction_item(summary: str) -> dict[str, Any]:
    return {"type": "compaction", "id": _id("cmp_lore_", summary),
            "encrypted_content": handle(summary)}


def responses_compaction_answer(summary: str, model: str, stream: bool) -> bytes:
    """``compaction_trigger``: exactly one ``compaction`` output item."""
    response = _response(_id("resp_lore_", summary), model, [compaction_item(summary)], 1)
    if not stream:
        return orjson.dumps(response)
    return b"".join(stream_from_response(response))


def compact_endpoint_body(summary: str) -> bytes:
    """``POST …/responses/compact``: the history that replaces the old one."""
    return orjson.dumps({"object": "response.compaction",
                         "output": [summary_message_item(summary)],
                         "usage": {"input_tokens": 0, "output_tokens": _tokens(summary),
                                   "total_tokens": _tokens(summary)}})


def summary_of_handle(value: Any) -> str | None:
    """The summary a handle of ours carries (None: not ours, or damaged)."""
    if not isinstance(value, str) or not value.startswith(HANDLE_PREFIX):
        return None
    try:
        return base64.b64decode(value[len(HANDLE_PREFIX):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def expand_handles(items: list[Any]) -> list[Any] | None:
    """``items`` with each of our compaction items replaced by the summary as a
    user message (None: no item of ours, the caller keeps its list)."""
    out: list[Any] | None = None
    for index, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") != "compaction":
            continue
        summary = summary_of_handle(item.get("encrypted_content"))
        if summary is None:
            continue
        if out is None:
            out = list(items)
        out[index] = {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"{EXPANDED_INTRO}\n\n{summary}"}]}
    return out
