"""Which requests are an agent asking for a compaction (sans-IO).

No header marks them (wave2-memory §4.1, §4.2; confirmed on Claude Code 2.1.197
and Codex 0.171 against the fake upstream), so each is recognised by its
structure:

* **Claude Code's summary fork** keeps the history and the tools and appends
  one text block, "CRITICAL: Respond with TEXT ONLY…" asking for an
  ``<analysis>`` and a ``<summary>``; the one message-level ``cache_control``
  marker sits on an *earlier* message, not on the appended prompt. Its fallback
  path has the one-line summarizer system prompt instead.
* **Codex local compaction** (a provider not named OpenAI, as ``lore run``
  sets up) is a normal ``/responses`` turn whose turn metadata says
  ``request_kind: compaction`` and whose last user message is the "CONTEXT
  CHECKPOINT COMPACTION" prompt.
* **Codex remote compaction v2** ends its input with ``{"type":
  "compaction_trigger"}``; v1 is its own path, ``…/responses/compact``.

Side channels (titles, classifiers) carry neither marker: they have no tools
and a short system prompt, and each check below needs the marker itself, so a
side channel can never pass for a compaction.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lore_gateway.protocols.history import HistoryAdapter

CLAUDE_SUMMARY_PREAMBLE = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."
CLAUDE_SUMMARY_MARKERS = ("<summary>", "summary of the conversation")
CLAUDE_FALLBACK_SYSTEM = "helpful AI assistant tasked with summarizing conversations"
CODEX_COMPACT_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION."
CODEX_TRIGGER_TYPE = "compaction_trigger"


class Flow(enum.StrEnum):
    """The compaction flows the gateway answers (metric label values)."""

    CLAUDE_SUMMARY = "claude_summary"
    CODEX_LOCAL = "codex_local"
    CODEX_TRIGGER = "codex_trigger"
    CODEX_COMPACT = "codex_compact"  # POST …/responses/compact


def detect(history: HistoryAdapter, payload: Mapping[str, Any],
           headers: Mapping[str, str]) -> Flow | None:
    """The compaction flow this model request is, or None for any other request.
    Each protocol's adapter knows which agent flows its requests may be
    (``HistoryAdapter.compaction_flow``: the checks below)."""
    if "x-lore-worker" in headers:
        return None
    return history.compaction_flow(payload, headers)


def codex_flow(payload: Mapping[str, Any], headers: Mapping[str, str]) -> Flow | None:
    """Codex's compaction requests (Responses ``input``)."""
    items = payload.get("input")
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    if items[-1].get("type") == CODEX_TRIGGER_TYPE:
        return Flow.CODEX_TRIGGER
    if _codex_request_kind(headers) == "compaction" or _is_codex_compact_prompt(items[-1]):
        return Flow.CODEX_LOCAL
    return None


def is_claude_summary(payload: Mapping[str, Any]) -> bool:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1]
    if last.get("role") != "user":
        return False
    text = _last_text(last.get("content"))
    if text is None or not all(m in text for m in CLAUDE_SUMMARY_MARKERS):
        return False
    # The fallback path: the one-line summarizer system prompt instead of the agent's.
    if CLAUDE_FALLBACK_SYSTEM in _system_text(payload.get("system"))[:1000]:
        return True
    # The fork moves the cache marker off the appended prompt (skipCacheWrite).
    return text.startswith(CLAUDE_SUMMARY_PREAMBLE) and not _has_cache_marker(last) and any(
        _has_cache_marker(m) for m in messages[:-1] if isinstance(m, dict))


def _last_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        block = content[-1]
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            return str(block["text"])
    return None


def _has_cache_marker(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and "cache_control" in b for b in content)


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    return ""


def _codex_request_kind(headers: Mapping[str, str]) -> str | None:
    raw = headers.get("x-codex-turn-metadata")
    if not raw or "compaction" not in raw:  # parsed only when it may say so
        return None
    try:
        kind = json.loads(raw).get("request_kind")
    except (ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def _is_codex_compact_prompt(item: Mapping[str, Any]) -> bool:
    if item.get("role") != "user":
        return False
    content = item.get("content")
    if isinstance(content, str):
        return content.startswith(CODEX_COMPACT_PROMPT)
    return isinstance(content, list) and any(
        isinstance(p, dict) and str(p.get("text", "")).startswith(CODEX_COMPACT_PROMPT)
        for p in content)
