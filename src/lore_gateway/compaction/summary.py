"""The summary a compaction is answered with, assembled from memory (pure).

No model call: the session's distillations (in order), an extractive log of
what was not distilled yet, the last raw exchanges verbatim, and the project's
knowledge. The text says where it came from and points at ``recall`` for
anything older, so the agent's next turn knows the full history is one call away.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_HEADING = "# Session summary (lore-gateway)"
SUMMARY_INTRO = ("lore-gateway assembled this summary from its memory of the session; nothing "
                 "was lost. Earlier details (exact commands, outputs, file contents) are one "
                 "`recall` tool call away.")
# Claude Code's summary output is capped at 20K tokens; stay well inside it.
MAX_SUMMARY_CHARS = 48_000
# The verbatim tail of the conversation (Lore caps its "recent activity" at 4,000).
RECENT_CHARS = 4_000
RECENT_MESSAGE_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class SessionMemory:
    """What the gateway remembers of one session, oldest first."""

    distillations: tuple[str, ...]
    undistilled_log: str  # extractive log of the messages no distillation covers yet
    recent: tuple[tuple[str, str], ...]  # (role, text) of the last raw messages
    knowledge: str = ""

    @property
    def empty(self) -> bool:
        return not self.distillations and not self.undistilled_log.strip() and not self.recent


def render(memory: SessionMemory, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    """The summary text; the oldest distillations after the first give way first."""
    recent = _recent(memory.recent)
    fixed = [SUMMARY_HEADING, SUMMARY_INTRO]
    tail: list[str] = []
    if memory.undistilled_log.strip():
        tail += ["## Not yet distilled", memory.undistilled_log.strip()]
    if recent:
        tail += ["## Recent activity (verbatim)", recent]
    if memory.knowledge.strip():
        tail.append(memory.knowledge.strip())
    room = max_chars - sum(len(p) + 2 for p in (*fixed, *tail)) - 40
    history = _fit(list(memory.distillations), room)
    body = fixed + (["## Conversation history", *history] if history else []) + tail
    return "\n\n".join(body)[:max_chars]


def _fit(texts: list[str], room: int) -> list[str]:
    """Keep the first text (the session's start) and as many of the latest as fit."""
    if sum(len(t) + 2 for t in texts) <= room:
        return texts
    if not texts:
        return []
    kept = [texts[0][: max(0, room)]]
    used = len(kept[0]) + 2
    latest: list[str] = []
    for text in reversed(texts[1:]):
        if used + len(text) + 2 > room:
            break
        latest.append(text)
        used += len(text) + 2
    return [*kept, "(… earlier distillations: use recall …)", *reversed(latest)]


def _recent(messages: tuple[tuple[str, str], ...]) -> str:
    lines: list[str] = []
    used = 0
    for role, text in reversed(messages):
        one = " ".join(text.split())
        if len(one) > RECENT_MESSAGE_CHARS:
            one = one[:RECENT_MESSAGE_CHARS] + " …"
        line = f"- {role}: {one}"
        if used + len(line) > RECENT_CHARS:
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(reversed(lines))
