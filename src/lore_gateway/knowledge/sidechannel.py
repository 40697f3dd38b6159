"""Which requests are the conversation, and which are side channels.

A side channel is a helper call an app makes beside its conversation: a title,
a topic, a one-line summary, a commit message, a permission or safety verdict.
It shares the conversation's headers (often its session id) but is not the
conversation: it gets no knowledge, is not distilled and starts no background
work (wave2-memory §4.1; Lore #1161, #1700). It is recognised by what side
channels are, never by the length of the agent's prompt: aider's conversations
carry no tools, and an SDK agent's instructions may be one line.

In order, the first rule that applies decides (``side_channel_reason``):

1. **marked by its sender**: the gateway's own worker (``x-lore-worker``); a
   Codex request whose ``x-codex-turn-metadata`` names a ``request_kind`` other
   than ``turn``;
2. **a classifier**: a stop sequence that closes an XML tag; Claude Code's
   permission and safety classifiers answer ``<block>…</block>`` or
   ``<severity>…</severity>`` and stop there;
3. **a helper's instructions**: the system prompt opens by asking for a title,
   a one-line summary of a conversation, a summary of the chat history, or a
   one-word or yes/no answer (OpenCode's title agent: "You are a title
   generator."; Claude Code's: "Summarize this coding conversation in under 50
   characters."; Gemini CLI's chat compression: "You are the component that
   summarizes internal chat history into a given structure.");
4. **tools**: a request that offers tools is the agent's own turn;
5. without tools:
   a. **a short answer**: output capped at ``MAX_SIDE_ANSWER_TOKENS`` or less
      (a title, a label, a verdict; a coding turn never asks for that little);
   b. **a verdict to a schema** (a classifier): Gemini's ``responseSchema`` or
      ``responseJsonSchema``. Gemini CLI's next-speaker, loop and model-routing
      checks send the conversation and ask for a JSON verdict, without tools;
   c. **a one-shot prompt**: nothing answered yet, no model turn in the
      request (the history adapter's assistant side or a tool output: a
      Gemini ``model`` content counts as Anthropic's ``assistant`` does).
      A helper asks its question outside the conversation: aider's
      commit messages and history summaries, Claude Code's topic and title
      calls, OpenCode's title call all have this shape. So does the very first
      request of a chat app without tools; its conversation is a coding turn
      from its second request on (aider's never looks like this: each of its
      requests carries its own "Ok." replies, ``memory/tenancy/fingerprint.py``).

Everything else is a coding turn: aider (no tools, a conversation), an SDK
agent with tools and a one-line prompt, Claude Code, Codex, OpenCode.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import orjson

from lore_gateway.protocols.history import HistoryAdapter, adapter_for
from lore_gateway.routing import Family

SideChannel = Literal["worker", "marked", "classifier", "helper", "short_answer", "one_shot"]

# Output caps at or below this are a side channel's when no tools are offered:
# titles, labels and verdicts fit in a few dozen tokens (Claude Code's quota
# probe asks for 1); coding agents ask for the model's maximum (Claude Code
# 32,000-64,000) or set nothing (aider, OpenCode).
MAX_SIDE_ANSWER_TOKENS = 256
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Gemini's generation settings (its JSON name, and the proto's the API also reads):
# the output cap, the stop sequences and the answer's schema.
_GEMINI_CONFIG = ("generationConfig", "generation_config")
_GEMINI_CAP = ("maxOutputTokens", "max_output_tokens")
_GEMINI_STOPS = ("stopSequences", "stop_sequences")
_GEMINI_SCHEMAS = ("responseSchema", "response_schema", "responseJsonSchema",
                   "response_json_schema")
# A stop sequence that closes an XML tag: a classifier stops after its verdict.
_CLOSING_TAG_RE = re.compile(r"</[A-Za-z][\w.-]*>\s*")
# Where a helper's instructions say what it is: their opening. A coding agent's
# prompt opens with who it is ("You are Claude Code", "Act as an expert
# software developer"), and may mention titles or summaries much later.
HELPER_HEAD_CHARS = 600
# Matched on the lower-cased head, and only when one of its words is there at
# all: the pattern backtracks at every word, 0.16 ms on a coding agent's head.
_HELPER_WORDS = ("title", "summar", " word", "yes or no", "true or false")
_HELPER_RE = re.compile(
    r"\btitle generator\b"
    r"|\b(?:generate|write|create|suggest|give|produce|extract)s?\b[^.\n]{0,40}\btitle\b"
    r"|\bsummari[sz](?:e|es|ing)\b[^.\n]{0,40}\bconversations?\b[^.\n]{0,20}"
    r"\b(?:in|under|within)\b[^.\n]{0,12}\d+\s*(?:words?|characters?|sentences?)\b"
    r"|\bsummari[sz](?:e|es|ing)\b[^.\n]{0,20}\bchat history\b"
    r"|\b(?:in|with) (?:one|a single|1) word\b"
    r"|\b(?:respond|answer|reply)\b[^.\n]{0,30}\b(?:yes or no|true or false)\b")


def is_coding_turn(family: str, payload: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether the request is the conversation's (else a side channel)."""
    return side_channel_reason(family, payload, headers) is None


def side_channel_reason(family: str, payload: Mapping[str, Any],
                        headers: Mapping[str, str]) -> SideChannel | None:
    """Why the request is a side channel (the module's rules), or None."""
    if "x-lore-worker" in headers:
        return "worker"
    if _codex_side_request(headers.get("x-codex-turn-metadata")):
        return "marked"
    config = _gemini_config(payload)
    stops = _stops(payload, config)
    if stops and any(_CLOSING_TAG_RE.fullmatch(stop) for stop in stops):
        return "classifier"
    history = adapter_for(Family(family))
    items = payload.get(history.items_key)
    if _helper(_system_head(payload, items, history).lower()):
        return "helper"
    tools = payload.get("tools")
    if isinstance(tools, list) and tools:
        return None
    cap = next((fields[f] for fields, names in ((payload, _MAX_TOKEN_FIELDS),
                                                (config, _GEMINI_CAP))
                for f in names if isinstance(fields.get(f), int)), None)
    if cap is not None and cap <= MAX_SIDE_ANSWER_TOKENS:
        return "short_answer"
    if any(config.get(f) for f in _GEMINI_SCHEMAS):
        return "classifier"
    if not _answered(items, history):
        return "one_shot"
    return None


def _helper(head: str) -> bool:
    return any(word in head for word in _HELPER_WORDS) and _HELPER_RE.search(head) is not None


def _codex_side_request(metadata: str | None) -> bool:
    if not metadata:
        return False
    try:
        kind = orjson.loads(metadata).get("request_kind")
    except (ValueError, AttributeError):
        return False
    return kind not in (None, "turn")


def _gemini_config(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    # The first of the two names present (its value None when it is null).
    config = payload.get(_GEMINI_CONFIG[0], payload.get(_GEMINI_CONFIG[1]))
    return config if isinstance(config, dict) else {}


def _stops(payload: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Anthropic's ``stop_sequences``, Chat's ``stop`` (a string or a list),
    Gemini's ``stopSequences`` in its generation settings."""
    found: list[str] = []
    values = [payload.get("stop_sequences"), payload.get("stop")]
    if config:  # (only Gemini's requests have one: no list built for the others)
        values += [config.get(k) for k in _GEMINI_STOPS]
    for value in values:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, str))
    return found


def _system_head(payload: Mapping[str, Any], items: Any, history: HistoryAdapter) -> str:
    """The opening of the request's instructions (system, instructions, Gemini's
    systemInstruction, the leading system or developer items), at most
    ``HELPER_HEAD_CHARS``."""
    parts: list[str] = []
    left = HELPER_HEAD_CHARS
    for text in _system_texts(payload, items, history):
        parts.append(text[:left])
        left -= len(parts[-1]) + 1
        if left <= 0:
            break
    return "\n".join(parts)


def _system_texts(payload: Mapping[str, Any], items: Any,
                  history: HistoryAdapter) -> Iterator[str]:
    for key in ("system", "instructions", "systemInstruction", "system_instruction"):
        value = payload.get(key)
        if value is not None:  # (most requests have one of the four at most)
            yield from _texts(value)
    if isinstance(items, list):
        for item in items:
            if not history.is_system(item):
                break  # only the instructions before the conversation
            yield from _texts(item.get("content"))


def _answered(items: Any, history: HistoryAdapter) -> bool:
    """Whether the history holds a model turn (or its tool traffic), in the
    protocol's own terms."""
    if not isinstance(items, list):
        return False
    return any(isinstance(item, dict)
               and (history.is_assistant_side(item) or history.is_tool_output(item))
               for item in items)


def _texts(value: Any) -> list[str]:
    """The text of a string, a list of text blocks, or a Gemini content's parts."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = value.get("parts")
    if isinstance(value, list):
        return [str(p.get("text", "")) for p in value if isinstance(p, dict)]
    return []
