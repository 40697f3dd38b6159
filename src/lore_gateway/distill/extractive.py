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
from lore_gateway.distill import prose
from lore_gateway.distill.format import LOW, MEDIUM, Observation

# Longest single observation, in characters: one user statement or error line.
MAX_OBSERVATION_CHARS = 400
# Files listed per "Files" line; the rest are counted.
MAX_FILES_LISTED = 12
# Failed tests and definitions named per tool output.
MAX_FAILED_TESTS = 12
MAX_DEFINITIONS = 12

# Harness blocks in user turns that no person typed.
_BOILERPLATE_RE = re.compile(
    r"<(environment_context|user_instructions|system-reminder|permissions instructions|"
    r"skills_instructions|command-[\w-]+|local-command-[\w-]+)>.*?</\1>", re.S)
_ERROR_RE = re.compile(
    r"\b[A-Z]\w*(?:Error|Exception|Failure)\b(?::|$)|"
    r"^(?:FAILED |FAIL: |ERROR: |fatal: |panic: |error(?:\[\w+\])?: )")
# A failed test as pytest (FAILED path::test) or unittest (FAIL: / ERROR: test (Class)) names it.
_FAILED_TEST_RE = re.compile(r"^(?:FAILED|FAIL:|ERROR:)\s+((?:\S+::\S+)|(?:test\w* \([\w.]+\)))")
_TEST_SUMMARY_RE = re.compile(
    r"^(?:=+ .*\b(?:passed|failed|error)\b.* =+|Ran \d+ tests? in .+|OK(?: \(.*\))?|"
    r"FAILED \((?:failures|errors)=.+\)|test result: .+|Tests?:? +\d+ .*(?:passed|failed).*)$")
_DEF_RE = re.compile(r"^(?:(\S+\.\w+):)?(\d+):\s*(?:async\s+)?(?:def|class|fn|func|function)\s+"
                     r"(\w+)")
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
            short = prose.short_output(text, at, last_command)
            if short is not None:
                yield short
            else:
                yield from _tool_findings(text, at, last_command)


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
    """Results, failed tests, the decisive error and definitions in one output."""
    where = f" in `{_one_line(command, 120)}`" if command else ""
    errors: list[str] = []
    failed: dict[str, None] = {}
    defined: list[str] = []
    summary: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        test = _FAILED_TEST_RE.match(line)
        if test:
            failed.setdefault(test.group(1).strip(), None)
        elif _TEST_SUMMARY_RE.match(line):
            summary.append(line.strip("= "))
        elif _ERROR_RE.search(line) and not line.startswith("Traceback"):
            errors.append(line)
        else:
            found = _DEF_RE.match(line)
            if found and found.group(3) and not found.group(3).startswith("test"):
                path = found.group(1) or _single_path(command) or "?"
                defined.append(f"`{found.group(3)}` at {path}:{found.group(2)}")
    if summary:
        yield Observation(MEDIUM, at, f"Result{where}: {_one_line(_summary(summary), 240)}")
    if failed:
        names = list(failed)[:MAX_FAILED_TESTS]
        more = f" (+{len(failed) - len(names)} more)" if len(failed) > len(names) else ""
        yield Observation(MEDIUM, at, "Failed: " + "; ".join(names) + more)
    if errors:
        # The last error line of an output is the one that names what went wrong.
        yield Observation(MEDIUM, at, f"Error{where}: {_one_line(errors[-1], 300)}")
    if defined:
        yield Observation(MEDIUM, at, "Defined: " + "; ".join(defined[:MAX_DEFINITIONS]))


def _summary(lines: list[str]) -> str:
    """unittest's two summary lines as one: ``Ran 3 tests; OK (skipped=1) (in 0.2s)``."""
    out: list[str] = []
    for line in lines:
        ran = re.match(r"Ran (\d+ tests?) in (\S+)$", line)
        if ran:
            out.append(f"Ran {ran.group(1)}")
            timing = f" (in {ran.group(2)})"
            continue
        if out and out[-1].startswith("Ran ") and line.startswith(("OK", "FAILED")):
            out[-1] += f"; {line}{timing}"
        else:
            out.append(line)
    return "; ".join(out)


def _command_of(arguments: str) -> str:
    match = re.search(r'"(?:command|cmd)"\s*:\s*(\[[^\]]*\]|"(?:[^"\\]|\\.)*")', arguments)
    if not match:
        return ""
    value = match.group(1)
    if value.startswith("["):
        return " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', value))
    return value[1:-1].encode().decode("unicode_escape", errors="replace")


def _single_path(command: str) -> str | None:
    paths = [p for p in _PATH_RE.findall(command) if p.endswith(".py")]
    return paths[0] if len(set(paths)) == 1 else None


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
