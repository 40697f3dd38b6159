"""Expanding recall markers in a Gemini request back into the exact model
``functionCall`` content + user ``functionResponse`` content (lore-spec B.6),
sans-IO.

A Gemini client gets a hidden recall's marker as a text part of the answer's one
model content (``recall/gemini/live.py``), set off by blank lines as a Chat
client gets it (``recall/chat/live.py`` ``marker_content``), because clients
merge the text parts of an answer: Gemini CLI keeps the preamble, the marker and
the continuation as one text part. Upstream must see what the model saw
instead: for each recall the model content the follow-up sent (the round's
parts up to the recall call) and the user content with its
``functionResponse``, then the rest of the answer as a model content of its own.

The stored model content is used verbatim, thought parts and their signatures
included, when the client's parts before the marker are its visible parts
(clients drop thought parts from their history); otherwise the client's parts
stay and only the stored call is added after them. An anchor that is unknown,
or whose conversation fingerprint does not match, is left alone.
"""

from __future__ import annotations

from typing import Any

from lore_gateway.memory.store.sanitize import ANCHOR_RE
from lore_gateway.protocols.gemini import function_call
from lore_gateway.recall.anthropic.expand import StoredPair
from lore_gateway.recall.chat.expand import Lookup, _marker_start, _trim_separator
from lore_gateway.recall.core.anchor_context import expand_turns, prefix_context_id

ANCHOR_PROBE = "lore-recall:"


def expand_contents(contents: list[Any], lookup: Lookup) -> list[Any] | None:
    """The contents with every known marker expanded, or None if none was."""
    def expand(content: Any, before: list[Any]) -> list[Any] | None:
        if isinstance(content, dict) and content.get("role") == "model":
            return _expand_content(content, prefix_context_id(before), lookup)
        return None

    return expand_turns(contents, expand)


def _answer_text(part: Any) -> str | None:
    """A part's text when it is answer text (not a thought summary)."""
    if not isinstance(part, dict) or part.get("thought") is True:
        return None
    text = part.get("text")
    return text if isinstance(text, str) else None


def _expand_content(content: dict[str, Any], context: str,
                    lookup: Lookup) -> list[Any] | None:
    parts = content.get("parts")
    if not isinstance(parts, list):
        return None
    pieces: list[Any] = []
    pending: list[Any] = []
    for part in parts:
        text = _answer_text(part)
        if text is None or ANCHOR_PROBE not in text:
            pending.append(part)
            continue
        cursor = 0
        for match in ANCHOR_RE.finditer(text):
            stored = lookup(match.group("uuid"))
            if stored is None or stored.context_id != context:
                continue
            start = _marker_start(text, match)
            if start < cursor:
                continue
            before = _trim_separator(text[cursor:start], leading=cursor > 0)
            if before:
                pending.append({**part, "text": before} if cursor == 0 else {"text": before})
            # A visible call the model made before the recall is answered by the
            # client's next content: it moves after the recall pair, since a
            # model content's calls are all answered by the content after it.
            calls = [p for p in pending if _is_call(p)]
            said = [p for p in pending if not _is_call(p)]
            pieces.extend([_model(stored, said), stored.tool_result])
            pending = calls
            cursor = match.end()
        if cursor == 0:
            pending.append(part)
            continue
        tail = _trim_separator(text[cursor:], leading=True, trailing=False)
        if tail:
            pending.append({"text": tail})
    if not pieces:
        return None
    if pending:
        pieces.append({**content, "parts": pending})
    return pieces


def _is_call(part: Any) -> bool:
    return isinstance(part, dict) and function_call(part) is not None


def _model(stored: StoredPair, pending: list[Any]) -> dict[str, Any]:
    """The stored model content when the client's parts before the marker are its
    visible parts, else those parts followed by the stored call."""
    stored_parts = list(stored.assistant.get("parts") or [])
    call = stored_parts[-1]
    visible = [p for p in stored_parts[:-1] if not (isinstance(p, dict) and p.get("thought"))]
    if _same(pending, visible):
        return stored.assistant
    return {"role": "model", "parts": [*pending, call]}


def _same(client: list[Any], stored: list[Any]) -> bool:
    """The same parts, text runs compared by their text (a client may merge or
    split a run, and drop a signature it does not keep)."""
    return _shape(client) == _shape(stored)


def _shape(parts: list[Any]) -> list[Any]:
    shaped: list[Any] = []
    for part in parts:
        text = _answer_text(part)
        if text is None:
            shaped.append(part)
        elif shaped and isinstance(shaped[-1], str):
            shaped[-1] += text
        else:
            shaped.append(text)
    return [s for s in shaped if s != ""]
