"""A conversation's name when its client sends no session id (pure functions).

Clients resend the whole conversation with every request, so the first message
the user wrote names the conversation for its whole life. The hard part is
"the user wrote": clients put text of their own before it, the same in every
conversation, and a fingerprint of that text makes every conversation of the
client one session. aider's did: each of its requests opens with a fixed
example exchange ("Change get_factorial() to use math.factorial"). Skipped,
each recognised by its shape rather than by the client's name where a shape
exists:

* **harness boilerplate** (Codex's ``<environment_context>``, Claude Code's
  ``<system-reminder>``, AGENTS.md blocks, Gemini CLI's ``<session_context>``
  part before the prompt in the first user content): user items or parts that
  open with a tag or heading the harness always writes;
* **an example conversation the client stages and then retracts**: aider plays
  an example exchange and follows it with "I switched to a new code base.
  Please don't consider the above files…" (``base_coder.format_chat_chunks``);
  everything up to that retraction is the client's;
* **priming pairs**: a user message the client answers itself with a short
  canned acknowledgement ("Ok.", "Ok, any changes I propose will be to those
  files."): aider's repository map, file listings, read-only files, history
  summary, and its system prompt sent as a user message to models without one;
* **a reminder appended to the newest message**: aider (``reminder: user``, the
  default of models without settings of their own) appends its system reminder
  to the user's message while it is the newest, and resends that message
  without it on every later request; a tail that repeats the system prompt is
  not the user's.

Limit: aider replaces its older history with a summary once the history grows
past its token budget; the conversation's first message is then gone from the
request, and the requests after that are a new session. Gemini CLI's chat
compression does the same (its history restarts at a ``<state_snapshot>``).

Gemini ``contents`` are read like the other shapes: a content's ``parts`` are
its content, and its ``model`` role is the assistant's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from lore_gateway.protocols.gemini import field, parts_of

# Harness-generated user items: identical across conversations, so useless as a
# fingerprint of one conversation.
BOILERPLATE_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<system-reminder>",
    "<permissions instructions>",
    "# AGENTS.md instructions",
    "<skills_instructions>",
    # Gemini CLI 0.61 (core/utils/environmentContext.js): the date, OS, workspace
    # directories and folder tree, the first part of the first user content;
    # hooks' additions are wrapped in <hook_context>. The CLI itself skips both
    # when it reads a session back (isIgnoredUserContent).
    "<session_context>",
    "<hook_context>",
)
# The roles a model's own turn is under: Gemini calls it ``model``.
ASSISTANT_ROLES = ("assistant", "model")
# The user message that retracts an example conversation staged before the real
# one (aider 0.86, aider/coders/base_coder.py). What precedes it is the client's.
RETRACTIONS = ("I switched to a new code base",)
# The retraction follows the example exchange right after the system prompt
# (aider: the system prompt, as a message or a pair, two example pairs at most,
# then the retraction: its 7th or 8th message), so only the head of a
# conversation is searched for it, never a long history.
RETRACTION_SCAN_ITEMS = 12
# A client's canned acknowledgement of its own priming message: "Ok." or
# "Ok, <what the assistant will do>", at most 113 characters in aider ("Ok,
# based on your requests I will suggest which files need to be edited and then
# stop and wait for your approval."). A model's own short reply ("ok", "OK",
# "Okay, …") is not taken for one.
ACK_MAX_CHARS = 160
_ACK_RE = re.compile(r"Ok(?:\.|,\s)")
# Blank-line boundaries tried when looking for an appended reminder: a reminder
# is a few paragraphs at the end, so a pasted log with thousands of blank lines
# costs at most this many substring searches.
REMINDER_SPLITS = 32
_PARAGRAPH = "\n\n"
FINGERPRINT_PREFIX = "fp-"


def fingerprint_session(body: Mapping[str, Any], project: str) -> str:
    """``fp-<hex>``: a hash of the project and the conversation's first message
    from its user. The project is mixed in so that "say hi" in two repositories
    is two sessions."""
    first = first_user_text(body)
    digest = hashlib.sha256(f"{project}\0{first}".encode()).hexdigest()
    return f"{FINGERPRINT_PREFIX}{digest[:20]}"


def first_user_text(body: Mapping[str, Any]) -> str:
    """The first text of the request that its user wrote ("" when none)."""
    items = conversation(body)
    if isinstance(items, str):
        return items.strip()
    if not isinstance(items, list):
        return ""
    found = _first_user(items)
    if found is None:
        return ""
    _, text, primed = found
    return _without_reminder(text, body, items, primed)


def has_answer(items: Any) -> bool:
    """Whether the conversation already holds an answer: an assistant item (or
    tool traffic) after its user's first message. A client's example exchange
    and its own "Ok." replies before that message are not answers (aider's
    first request carries both)."""
    if not isinstance(items, list):
        return False
    found = _first_user(items)
    start = found[0] + 1 if found is not None else 0
    return any(isinstance(item, dict) and (item.get("role") in ASSISTANT_ROLES or item.get(
        "type") in ("function_call", "function_call_output", "reasoning"))
        for item in items[start:])


def conversation(body: Mapping[str, Any]) -> Any:
    """The request's conversation: Responses ``input``, Chat and Anthropic
    ``messages``, Gemini ``contents``."""
    for key in ("input", "messages", "contents"):
        if key in body:
            return body[key]
    return None


def item_content(item: Mapping[str, Any]) -> Any:
    """A conversation item's content: ``content``, or a Gemini content's parts."""
    return item["content"] if "content" in item else parts_of(item)


def instruction_texts(body: Mapping[str, Any]) -> Iterator[str]:
    """The request's instructions outside the conversation: Responses
    ``instructions``, Anthropic ``system``, Gemini ``systemInstruction``."""
    for key in ("instructions", "system"):
        yield from texts(body.get(key))
    if "systemInstruction" in body or "system_instruction" in body:  # Gemini's only
        yield from texts(parts_of(field(body, "systemInstruction", "system_instruction")))


def _first_user(items: list[Any]) -> tuple[int, str, list[str]] | None:
    """Where the user's first message is, its text, and the client's priming
    texts skipped on the way (None: no message of the user's)."""
    primed: list[str] = []
    start = _after_retraction(items)
    for index, item in enumerate(items):
        if not _is_role(item, "user"):
            continue
        if _acknowledged(items, index):
            primed.extend(texts(item_content(item)))
            continue
        if index < start:
            continue
        for text in texts(item_content(item)):
            if text and not text.startswith(BOILERPLATE_PREFIXES):
                return index, text, primed
    return None


def texts(content: Any) -> Iterator[str]:
    """The stripped texts of a message's content (a string or a list of parts)."""
    if isinstance(content, str):
        yield content.strip()
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"].strip()


def _is_role(item: Any, role: str) -> bool:
    return isinstance(item, dict) and item.get("role") == role


def _after_retraction(items: list[Any]) -> int:
    """Where the conversation starts: after a retracted example exchange, else 0."""
    for index, item in enumerate(items[:RETRACTION_SCAN_ITEMS]):
        if _is_role(item, "user") and any(
                text.startswith(RETRACTIONS) for text in texts(item_content(item))):
            return index + 1
    return 0


def _acknowledged(items: list[Any], index: int) -> bool:
    """Whether the user message at ``index`` is a priming message: the item after
    it is the client's canned acknowledgement."""
    following = items[index + 1] if index + 1 < len(items) else None
    if not isinstance(following, dict) or following.get("role") not in ASSISTANT_ROLES:
        return False
    reply = "".join(texts(item_content(following)))
    return len(reply) <= ACK_MAX_CHARS and _ACK_RE.match(reply) is not None


def _without_reminder(text: str, body: Mapping[str, Any], items: list[Any],
                      primed: list[str]) -> str:
    """``text`` without a trailing run of paragraphs that repeats the system
    prompt (or the priming messages: a system prompt sent as a user message)."""
    if _PARAGRAPH not in text:
        return text
    system = "\n".join([*_system_texts(body, items), *primed])
    if not system:
        return text
    # Only a tail no longer than the system prompt can repeat it.
    at = text.find(_PARAGRAPH, max(0, len(text) - len(system) - len(_PARAGRAPH)))
    for _ in range(REMINDER_SPLITS):
        if at <= 0:
            break
        tail = text[at:].strip()
        if tail and tail in system:
            return text[:at].rstrip()
        at = text.find(_PARAGRAPH, at + len(_PARAGRAPH))
    return text


def _system_texts(body: Mapping[str, Any], items: list[Any]) -> Iterator[str]:
    yield from instruction_texts(body)
    for item in items:
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            yield from texts(item.get("content"))
