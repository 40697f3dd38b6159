"""What a user asked the gateway not to keep: the request switch and private spans.

Two pure rules, no I/O (the session switch, ``lore amnesia``, lives in the
database: ``memory/data/amnesia.py``):

* ``no_store_requested``: a request carrying ``x-lore-no-store`` is forwarded
  (the header is stripped upstream like every ``x-lore-*`` header) and nothing of
  its turn is kept (docs/memory.md, "Keeping things out of memory").
* ``redact_turn``: text between ``<private>`` and ``</private>`` in a user
  message reaches the provider unchanged, but the turn handed to memory carries
  ``[private]`` in its place. It runs where a turn becomes a ``TurnRecord``
  (``memory.service.PendingTurn``; the writer runs it again over every turn it
  writes, imports included), so storage, the search indexes, embeddings,
  distillation, the worker's requests and the context manager's state only ever
  see the redacted text. Only user messages are read for tags: a tool output
  that prints ``<private>`` (a file of this very repository, say) is content,
  not an instruction. The private text is then also replaced wherever the same
  turn repeats it (an answer that quotes it, a tool call that uses it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

import orjson

from lore_gateway.protocols.common import Message

NO_STORE_HEADER = "x-lore-no-store"
# Header values that mean "store as usual". Anything else, a typo included, means
# "do not store": a user who sends the header at all wants the turn kept out, and
# guessing wrong the other way would keep what they asked to drop.
_STORE_VALUES = frozenset({"0", "false", "no", "off"})

PRIVATE_PLACEHOLDER = "[private]"
# A span from <private> to the next </private>; an unclosed tag runs to the end of
# the message (fail closed: the user meant the rest to be private). Tags in any case.
_PRIVATE_RE = re.compile(r"<private>(.*?)(?:</private>|\Z)", re.IGNORECASE | re.DOTALL)
_PROBE = "<private>"
# Private text shorter than this is not searched for elsewhere in the turn: a
# two-letter span would blank every "no" or "ok" of the answer. Four characters
# still covers a PIN.
MIN_ECHO_CHARS = 4


def no_store_requested(headers: Mapping[str, str]) -> bool:
    """Whether the request asks to be kept out of memory (``headers`` lower-cased)."""
    value = headers.get(NO_STORE_HEADER)
    return value is not None and value.strip().lower() not in _STORE_VALUES


def has_private(text: str) -> bool:
    return _PROBE in text.lower()


def redact_private(text: str) -> tuple[str, list[str]]:
    """``text`` with every private span (tags included) replaced by ``[private]``,
    and the private texts found (stripped, non-empty)."""
    if not has_private(text):
        return text, []
    found = [m.group(1).strip() for m in _PRIVATE_RE.finditer(text)]
    return _PRIVATE_RE.sub(PRIVATE_PLACEHOLDER, text), [f for f in found if f]


def redact_turn(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The turn's messages as memory may keep them: private spans of user messages
    replaced, and their text replaced wherever else the turn repeats it (as
    written, or escaped inside a JSON string: a tool call's arguments). The same
    objects come back when no user message has a tag (the common case costs one
    lower-cased scan per user message)."""
    hidden: list[str] = []
    out: list[Message] = []
    for message in messages:
        if message.role == "user":
            text, found = redact_private(message.text)
            if found or text is not message.text:
                hidden.extend(found)
                message = Message(message.role, text)
        out.append(message)
    if not hidden and all(a is b for a, b in zip(out, messages, strict=True)):
        return tuple(messages)
    echoes = _echo_forms(hidden)
    return tuple(_without(m, echoes) for m in out)


def _echo_forms(hidden: list[str]) -> list[str]:
    """The private texts worth searching for, each as written and JSON-escaped,
    longest first (so a longer secret is replaced before a shorter one inside it)."""
    forms: set[str] = set()
    for text in hidden:
        if len(text) >= MIN_ECHO_CHARS:
            forms.add(text)
            # Escaped as orjson writes it (UTF-8 kept) and as json.dumps does (\uXXXX).
            forms.add(orjson.dumps(text).decode()[1:-1])
            forms.add(json.dumps(text)[1:-1])
    return sorted(forms, key=len, reverse=True)


def _without(message: Message, echoes: list[str]) -> Message:
    text = message.text
    for echo in echoes:
        if echo in text:
            text = text.replace(echo, PRIVATE_PLACEHOLDER)
    return message if text is message.text else Message(message.role, text)
