"""The summary a compaction is answered with, assembled from memory (pure).

No model call. The agent loses its whole context to this text, so every character
goes to facts: the session's observations over its whole length (its distillations'
and what its raw messages show, ``store.session_memory``), chosen by the facts they
carry when they do not all fit (``format.fit_indices``: findings before minor
context, then facts per character); then where things stand (the last request and
the last reply, prose only: no raw tool output); then the project's knowledge. The
text says what it kept and what it left out, and points at ``recall`` for the rest.

Its size is a tenth of the session it replaces (at least ``MIN_SUMMARY_CHARS``,
at most ``MAX_SUMMARY_CHARS``): the agent gets its window back (≥ 10×
compression), and a short session is not padded to a fixed size.
"""

from __future__ import annotations

from dataclasses import dataclass

from lore_gateway.distill import format as fmt
from lore_gateway.distill.format import Observation

SUMMARY_HEADING = "# Session summary (lore-gateway)"
# Claude Code's summary output is capped at 20K tokens; stay well inside it.
MAX_SUMMARY_CHARS = 48_000
# The summary takes at most 1/COMPRESSION of the session's characters.
COMPRESSION = 10
# Below this a summary cannot say much; a session this small is barely compacted.
MIN_SUMMARY_CHARS = 2_000
# Where things stand: the last request and reply, cut to these many characters.
LAST_REQUEST_CHARS = 600
LAST_REPLY_CHARS = 600
# "* 🟡 " before each observation's text; its clock time is a line of its own,
# once per minute (what happened in one minute shares it).
BULLET_OVERHEAD = 5
# The knowledge block may take at most this share of the summary.
KNOWLEDGE_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class Dated:
    """An observation and the date line of the log it belongs to."""

    date: str
    observation: Observation


@dataclass(frozen=True, slots=True)
class SessionMemory:
    """What the gateway remembers of one session, oldest first."""

    observations: tuple[Dated, ...]
    messages: int  # the session's raw messages
    source_chars: int  # their characters: what the summary replaces
    last_request: str = ""  # the user's newest words
    last_reply: str = ""  # the assistant's newest prose
    knowledge: str = ""

    @property
    def empty(self) -> bool:
        return not self.observations and not self.last_request and not self.last_reply


def budget(memory: SessionMemory, max_chars: int = MAX_SUMMARY_CHARS) -> int:
    return min(max_chars, max(MIN_SUMMARY_CHARS, memory.source_chars // COMPRESSION))


def render(memory: SessionMemory, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    room = budget(memory, max_chars)
    standing = _standing(memory)
    knowledge = memory.knowledge.strip()
    if len(knowledge) > room * KNOWLEDGE_SHARE:
        knowledge = ""
    tail = [part for part in (standing, knowledge) if part]
    # The intro's longest form (its counts are known once the history is chosen).
    intro_room = len(_intro(memory, 0)) + 2
    left = room - len(SUMMARY_HEADING) - intro_room - sum(len(p) + 2 for p in tail) - 40
    every = [d.observation for d in memory.observations]
    chosen = fmt.fit_indices(every, max(0, left), overhead=BULLET_OVERHEAD)
    history = _history([memory.observations[i] for i in chosen])
    body = [SUMMARY_HEADING, _intro(memory, len(chosen)),
            *(["## Conversation history", history] if history else []), *tail]
    return "\n\n".join(body)[:room]


def _intro(memory: SessionMemory, kept: int) -> str:
    total = len(memory.observations)
    held = ("all of them" if kept == total else
            f"{kept} of them, chosen for the facts they carry")
    return (f"lore-gateway assembled this summary from its memory of this session "
            f"({memory.messages} messages): {total} observations, {held}. It is not the "
            "whole session: exact outputs, file contents and anything not listed here "
            "are one `recall` tool call away (search for a file, an error, a command or "
            "a decision).")


def _history(items: list[Dated]) -> str:
    """Date lines, then clock times, each shown once above what happened then."""
    lines: list[str] = []
    date = clock = None
    for item in items:
        if item.date != date:
            date, clock = item.date, None
            lines.append(date)
        if item.observation.time != clock:
            clock = item.observation.time
            lines.append(f"({clock})")
        lines.append(f"* {item.observation.mark} {item.observation.text}")
    return "\n".join(lines)


def _standing(memory: SessionMemory) -> str:
    lines = []
    if memory.last_request.strip():
        lines.append("- Last request (user): " + _cut(memory.last_request, LAST_REQUEST_CHARS))
    if memory.last_reply.strip():
        lines.append("- Last reply (assistant): " + _cut(memory.last_reply, LAST_REPLY_CHARS))
    return "## Where things stand\n" + "\n".join(lines) if lines else ""


def _cut(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
