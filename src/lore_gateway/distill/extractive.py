"""The extractive distiller: an observation log from raw turns, no model call.

Used whenever the worker may not run (``LORE_WORKER=off``, budget spent, upstream
failing, no credentials), so the rest of the system always has distillations.
It keeps what a later session most often needs, verbatim: the user's own
statements (highest priority), decisions and root causes the assistant stated,
errors and test results from tool output, commands run, definitions found, and
the files involved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from lore_gateway.distill import format as fmt
from lore_gateway.distill import prose, tool_output
from lore_gateway.distill.format import LOW, Observation

# Longest single observation, in characters: one user statement or error line.
MAX_OBSERVATION_CHARS = 400
# Files listed per "Files" line; the rest are counted.
MAX_FILES_LISTED = 12

# Harness blocks in user turns that no person typed.
_BOILERPLATE_RE = re.compile(
    r"<(environment_context|user_instructions|system-reminder|permissions instructions|"
    r"skills_instructions|command-[\w-]+|local-command-[\w-]+)>.*?</\1>", re.S)
_PATH_RE = re.compile(r"(?<![\w/.-])((?:\.{0,2}/)?(?:[\w.-]+/)+[\w.-]+\.[A-Za-z]\w{0,5})\b")
_COMMAND_RE = re.compile(r"```(?:bash|sh|shell|console)?\n(.+?)```", re.S)
_TOOL_CALL_RE = re.compile(r"^\[tool_call:(\w+)\]\s*(.*)$", re.S)


@dataclass(frozen=True, slots=True)
class SourceMessage:
    id: int
    role: str
    content: str
    created_at: float


def distill(messages: list[SourceMessage], *, budget_tokens: int | None = None) -> str:
    """The observation log for ``messages`` (oldest first), within the budget."""
    if not messages:
        return ""
    input_tokens = sum(fmt.estimate_tokens(m.content) for m in messages)
    budget = budget_tokens if budget_tokens is not None else fmt.budget_tokens(input_tokens)
    date = fmt.date_line(messages[0].created_at)
    kept = fmt.fit(candidates(messages), budget * fmt.CHARS_PER_TOKEN - len(date) - 1)
    return fmt.render(date, kept)


def candidates(messages: list[SourceMessage]) -> list[Observation]:
    """Every observation ``messages`` offer (deduplicated, in order), before any budget."""
    if not messages:
        return []
    observations = list(_observations(messages))
    files = _files(messages)
    if files:
        listed = files[:MAX_FILES_LISTED]
        more = f" (+{len(files) - len(listed)} more)" if len(files) > len(listed) else ""
        observations.append(Observation(LOW, fmt.clock(messages[-1].created_at),
                                        "Files: " + ", ".join(listed) + more))
    return _dedupe(observations)


def _observations(messages: list[SourceMessage]) -> Iterable[Observation]:
    last_command = ""
    for index, message in enumerate(messages):
        at = fmt.clock(message.created_at)
        text = message.content
        if message.role == "user":
            said = prose.user_observation(user_text(text), at)
            if said is not None:
                yield said
        elif message.role == "assistant":
            call = _TOOL_CALL_RE.match(text.strip())
            if call:
                last_command = _command_of(call.group(2)) or last_command
                if last_command:
                    yield prose.command_observation(last_command, at)
                continue
            yield from prose.assistant_observations(text, at,
                                                    closing=_closes_turn(messages, index))
            for block in _COMMAND_RE.findall(text):
                last_command = block.strip()
                yield prose.command_observation(last_command, at)
        elif message.role == "tool":
            # A short output is also kept whole: its lines are the values asked
            # about later; the fit keeps whichever of the two carries new facts.
            yield from _tool_findings(text, at, last_command)
            short = prose.short_output(text, at, last_command)
            if short is not None:
                yield short


def _closes_turn(messages: list[SourceMessage], index: int) -> bool:
    """Whether the assistant spoke last before the user's next words (its summary)."""
    following = messages[index + 1] if index + 1 < len(messages) else None
    return following is not None and following.role == "user" and bool(
        user_text(following.content))


def user_text(text: str) -> str:
    """The user's own text: harness blocks (environment, reminders) removed."""
    if text.lstrip().startswith(("[tool:", "# AGENTS.md instructions")):
        return ""
    return _BOILERPLATE_RE.sub(" ", text).strip()


def _tool_findings(text: str, at: str, command: str) -> Iterable[Observation]:
    """Results, failed tests, the decisive errors and definitions in one output (the
    rules per ecosystem: ``distill/tool_output.py``)."""
    return tool_output.observations(text, at, command)


def _command_of(arguments: str) -> str:
    match = re.search(r'"(?:command|cmd)"\s*:\s*(\[[^\]]*\]|"(?:[^"\\]|\\.)*")', arguments)
    if not match:
        return ""
    value = match.group(1)
    if value.startswith("["):
        return " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', value))
    return value[1:-1].encode().decode("unicode_escape", errors="replace")


def _files(messages: list[SourceMessage]) -> list[str]:
    seen: dict[str, None] = {}
    for message in messages:
        if message.role in ("user", "assistant"):
            for path in _PATH_RE.findall(message.content):
                if not path.startswith(("http", "//")) and "://" not in path:
                    seen.setdefault(path.removeprefix("./"), None)
    return list(seen)


def _one_line(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _dedupe(observations: list[Observation]) -> list[Observation]:
    seen: set[str] = set()
    out: list[Observation] = []
    for obs in observations:
        if obs.text not in seen:
            seen.add(obs.text)
            out.append(obs)
    return out
