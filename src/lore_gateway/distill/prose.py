"""What the extractive distiller keeps of what people and agents *say* (pure).

Tool output has its own rules (``tool_output``); this module covers the rest:

- **the user**: every statement that says something (a request, an instruction, a
  decision), 🔴; a bare "continue" or "ok" carries nothing and is not kept;
- **the assistant's prose**, sentence by sentence: findings and decisions (what
  was found, why, what was chosen or dropped) 🟡, plans ("I will read …") 🟢,
  and sentences that carry no fact and no finding are not kept. A turn's closing
  text (the last thing the assistant said before the user spoke again: the
  summary that lists the commit, the PR, the files) is kept whole, 🟡;
- **commands**: one that changes a file (``sed -i``, a heredoc into a file, a
  patch) is an edit, 🟡, with the command verbatim; any other is 🟢;
- **short outputs**: a command's output of a screenful or less (a reproduction
  script's prints) is kept verbatim beside its findings, 🟡, less a test runner's
  headers and progress lines and Python's warnings: such lines are the values a
  later question asks about.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lore_gateway.distill import format as fmt
from lore_gateway.distill.format import HIGH, LOW, MEDIUM, Observation

# Longest sentence or user statement kept, in characters.
MAX_SENTENCE_CHARS = 400
# A closing text longer than this is kept in its first and last parts.
MAX_CLOSING_CHARS = 1_200
# Longest command kept; an edit's command is the fact, so it gets more room.
MAX_COMMAND_CHARS = 200
MAX_EDIT_CHARS = 320
# A command named as the source of an output: its first line, this long at most.
MAX_LABEL_CHARS = 80
# An output this short (non-blank lines, characters: about a screenful, less its
# headers) is kept whole beside its findings.
SHORT_OUTPUT_LINES = 20
SHORT_OUTPUT_CHARS = 1_000

_CODE_BLOCK = re.compile(r"```[\w+-]*\n?(.*?)(?:```|$)", re.S)
_FINDING_RE = re.compile(
    r"\b(decid\w*|chose|choose|instead|switch(?:ed)? to|we(?:'ll| will) use|going with|"
    r"root cause|the (?:bug|problem|issue|error|fix|reason) (?:is|was)|fix(?:ed|es)?\b|"
    r"because|so that|prefer|turns? out|found|confirm\w*|fail\w*|broke\w*|breaks?|"
    r"passe[sd]|wrong|realiz\w*|forgot|mistake|disaster|"
    r"not (?:called|used|set|found)|revert\w*|undo|"
    r"restor\w*|abandon\w*|drop\w*|caus\w*)\b", re.I)
_PLAN_RE = re.compile(r"^(?:THOUGHT:\s*)?(?:I will|I'll|Let me|Let's|Now,? (?:I|let)|"
                      r"Next,? I|First,? I|I need to|I am going to|I'm going to)\b", re.I)
_EDIT_RE = re.compile(r"\bsed\s+(?:-\w+\s+)*-i|\bperl\s+-\w*i|\bpatch\b|\bgit apply\b|"
                      r"\bapply_patch\b|\bcat\s*>>?\s*\S+|\btee\s+\S+|(?<![<>2&])>>?\s*[\w./-]+\.\w+")
# Harness tags that wrap a command's output (mini-swe-agent's <returncode>, <output>).
_WRAPPER_RE = re.compile(r"^\s*</?[a-z_]+>(?:\d+</[a-z_]+>)?\s*|\s*</?[a-z_]+>\s*$")
# A test runner's header and progress lines (``tests/a.py ....F.. [ 40%]``): the
# same in every run or a row of dots, never a fact.
_HEADER_RE = re.compile(
    r"^(?:[=_-]{3,}(?: [^0-9]* [=_-]{3,})?$|platform \w+ -- |rootdir: |cachedir: |"
    r"plugins: |configfile: |executable: |architecture: |cache: |ground types: |numpy: |"
    r"random seed: |"
    r"hash randomization: |Testing against Django installed|Creating test database|"
    r"Cloning test database|Destroying test database|Using existing test database|"
    r"System check identified no issues|Found \d+ test\(s\)\.$|"
    r"\S*(?:\[\d+\])?\s*[.FEsxXfw]+\s*(?:\[\s*\d+%\])?$)")
# A short output that names no identifier is still kept when it complains: a
# tool's own error ("grep: Unmatched [", "bash: psql: command not found").
_COMPLAINT_RE = re.compile(r"\b(?:error|fail\w*|not found|unmatched|denied|invalid|"
                           r"cannot|can't|no such|unknown|refused|timed? ?out)\b", re.I)
_PY_WARNING_RE = re.compile(r"^\S+:\d+: [A-Z]\w*Warning: ")
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])|\n+")


def user_observation(said: str, at: str) -> Observation | None:
    """A user's statement (harness blocks already removed); None when it says nothing."""
    flat = " ".join(said.split())
    if not flat or (len(flat.split()) <= 3 and fmt.facts(flat) == 0):
        return None
    return Observation(HIGH, at, "User: " + one_line(flat, MAX_SENTENCE_CHARS))


def assistant_observations(text: str, at: str, *, closing: bool) -> Iterable[Observation]:
    """Findings and plans of one assistant message (its commands are separate)."""
    prose = _CODE_BLOCK.sub(" ", text).strip()
    if not prose:
        return
    if closing:
        yield Observation(MEDIUM, at, "Said: " + _ends(" ".join(prose.split()),
                                                        MAX_CLOSING_CHARS))
        return
    for sentence in sentences(prose):
        found = _FINDING_RE.search(sentence) is not None
        carries = fmt.facts(sentence) > 0
        if _PLAN_RE.match(sentence):
            if carries:
                yield Observation(LOW, at, one_line(_plain(sentence), MAX_SENTENCE_CHARS))
        elif found or carries:
            yield Observation(MEDIUM if found else LOW, at,
                              one_line(_plain(sentence), MAX_SENTENCE_CHARS))


def command_observation(command: str, at: str) -> Observation:
    """An edit (🟡, with more of the command) or any other command run (🟢)."""
    if _EDIT_RE.search(command):
        first = command.strip().splitlines()[0] if command.strip() else command
        shown = command if len(command) <= MAX_EDIT_CHARS else first
        return Observation(MEDIUM, at, f"Edited with `{one_line(shown, MAX_EDIT_CHARS)}`")
    return Observation(LOW, at, f"Ran `{one_line(command, MAX_COMMAND_CHARS)}`")


def short_output(text: str, at: str, command: str) -> Observation | None:
    """A short output kept verbatim, its lines joined by `` | ``; None when long."""
    lines = [_WRAPPER_RE.sub("", line).strip() for line in _without_warnings(text)]
    lines = [line for line in lines if line and not _HEADER_RE.match(line)]
    if not lines or len(lines) > SHORT_OUTPUT_LINES:
        return None
    joined = " | ".join(lines)
    if len(joined) > SHORT_OUTPUT_CHARS or (fmt.facts(joined) == 0
                                             and not _COMPLAINT_RE.search(joined)):
        return None
    return Observation(MEDIUM, at, f"Output{label(command)}: {joined}")


def _without_warnings(text: str) -> list[str]:
    """The output's lines less Python's warnings (``path:12: DeprecationWarning: …``
    and the source line it quotes below it): the same in every run of a script."""
    out: list[str] = []
    skip_source = False
    for line in text.splitlines():
        if _PY_WARNING_RE.match(line):
            skip_source = True
            continue
        if skip_source and line.startswith((" ", "\t")):
            skip_source = False
            continue
        skip_source = False
        out.append(line)
    return out


def label(command: str) -> str:
    """`` of `cmd` ``: a command named by its first line (a heredoc's script is not)."""
    first = command.strip().splitlines()[0] if command.strip() else ""
    return f" of `{one_line(first, MAX_LABEL_CHARS)}`" if first else ""


def sentences(prose: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(prose) if len(s.strip()) > 12]


def one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _plain(sentence: str) -> str:
    return re.sub(r"^THOUGHT:\s*", "", sentence)


def _ends(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + " … " + text[-half:]
