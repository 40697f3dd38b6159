"""Key-fact retention, and the same-size baselines a memory text must beat (pure).

A key fact is a verbatim string a question's answer needs (``natural_questions``'
``key_facts``, ``coding_eval``'s ``evidence``). A text keeps it when the fact
appears in it, whitespace runs counted as one space (the observation log writes
each observation on one line, so a fact that spans lines in a tool output is kept
when its words stay in order).

The baselines are what a trivial extractor keeps in the same number of characters,
from the same session, so a memory text is only credited with what its choices
add:

- ``last``: the newest characters of the transcript (what a plain truncation keeps);
- ``first_last``: half the room from the start, half from the end;
- ``closing``: the user messages plus the closing text of each assistant turn (the
  assistant's last message before the next user message, its prose only), first
  and last halves when it is too long (issue 32's trivial extractor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# The code blocks of an assistant message (its command), dropped from its prose.
_CODE_BLOCK = re.compile(r"```.*?(?:```|$)", re.S)
BASELINES = ("last", "first_last", "closing")


def normal(text: str) -> str:
    return " ".join(text.split())


def kept(facts: Iterable[str], text: str) -> list[bool]:
    """For each fact, whether ``text`` holds it (whitespace-normalised)."""
    flat = normal(text)
    return [normal(f) in flat for f in facts]


def transcript(messages: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"{role}: {content}" for role, content in messages)


def last(messages: Sequence[tuple[str, str]], chars: int) -> str:
    text = transcript(messages)
    return text[-chars:] if chars > 0 else ""


def first_last(messages: Sequence[tuple[str, str]], chars: int) -> str:
    return _ends(transcript(messages), chars)


def closing(messages: Sequence[tuple[str, str]], chars: int) -> str:
    """The user messages and each assistant turn's closing prose, cut to ``chars``."""
    parts: list[str] = []
    pending = ""
    for role, content in messages:
        if role == "user":
            if pending:
                parts.append(f"assistant: {pending}")
                pending = ""
            parts.append(f"user: {content}")
        elif role == "assistant":
            prose = _CODE_BLOCK.sub(" ", content).strip()
            pending = prose or pending
    if pending:
        parts.append(f"assistant: {pending}")
    return _ends("\n".join(parts), chars)


def baseline(name: str, messages: Sequence[tuple[str, str]], chars: int) -> str:
    return {"last": last, "first_last": first_last, "closing": closing}[name](messages, chars)


def _ends(text: str, chars: int) -> str:
    if len(text) <= chars:
        return text
    if chars <= 0:
        return ""
    head = chars // 2
    tail = chars - head - 1  # the newline between the two ends counts too
    return text[:head] + "\n" + text[len(text) - tail:]


@dataclass
class Retention:
    """Facts kept over a set of questions, and the characters it took."""

    facts: int = 0
    kept: int = 0
    questions: int = 0
    complete: int = 0  # questions with every fact kept
    source_chars: int = 0
    text_chars: int = 0
    ratios: list[float] = field(default_factory=list)

    def add(self, flags: list[bool]) -> None:
        if not flags:
            return
        self.questions += 1
        self.facts += len(flags)
        self.kept += sum(flags)
        self.complete += all(flags)

    def size(self, source_chars: int, text_chars: int) -> None:
        self.source_chars += source_chars
        self.text_chars += text_chars
        if text_chars:
            self.ratios.append(source_chars / text_chars)

    def as_dict(self) -> dict[str, float | int | None]:
        ratios = sorted(self.ratios)
        return {
            "n": self.questions,
            "facts": self.facts,
            "kept": round(self.kept / self.facts, 3) if self.facts else None,
            "complete": round(self.complete / self.questions, 3) if self.questions else None,
            "compression": (round(self.source_chars / self.text_chars, 1)
                            if self.text_chars else None),
            "min_compression": round(ratios[0], 1) if ratios else None,
        }
