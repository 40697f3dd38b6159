"""What one tool output is worth keeping: results, failed tests, errors, definitions.

The extractive distiller (``distill/extractive.py``) reads every tool output of
a segment with no model call. This module holds its rules per ecosystem, as
data: one table per kind of finding, each row a pattern whose ``keep`` group (or
whole line) is kept verbatim, identifiers and numbers included.

- results: test summaries (pytest, unittest/Django, jest, vitest, bun, mocha,
  go test, cargo test, maven surefire), build / lint / type-check summaries (tsc,
  mypy, ruff, eslint, javac, cargo, maven, gradle), git (commit, diffstat, push,
  merge, rebase), pull-request URLs, HTTP status lines;
- failed tests, by the name each runner prints;
- errors: the decisive line of each stack trace with the user's frame
  (``distill/traces.py``), compiler and linter diagnostics with their location,
  and only when neither is present the tool's own error lines (npm, pnpm, yarn,
  git, maven …), boilerplate removed;
- definitions from ``grep -n`` / ``cat -n`` listings (``distill/definitions.py``);
- warnings with a location, as minor context.

Everything else (progress bars, passing test names, blank lines, banners) is
noise. Within one output each finding is kept once. ``findings`` is pure: text
and the command that produced it in, ``Findings`` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lore_gateway.distill.definitions import Definition, definition, listing_of
from lore_gateway.distill.format import LOW, MEDIUM, Observation
from lore_gateway.distill.traces import TraceReader

# Failed tests and definitions named per tool output; the rest are counted.
MAX_FAILED_TESTS = 12
MAX_DEFINITIONS = 12
# Errors kept per output: the first ones (a compiler's first error usually causes
# the rest) and the last (the one that stopped a script). Three name both ends
# without a flood of one cause's echoes.
MAX_ERRORS = 3
# The tool's own error lines (npm ERR!, git's error:) say less than a diagnostic;
# when they are all there is, the first and the last are kept.
MAX_GENERIC_ERRORS = 2
# Warnings are minor context (🟢): two say what kind a run had without listing it.
MAX_WARNINGS = 2
# Characters per rendered finding: a result line, an error with its frame.
MAX_RESULT_CHARS = 240
MAX_ERROR_CHARS = 300
MAX_COMMAND_CHARS = 120
# A longer line is data (minified code, JSON), not a tool's message; only its
# head is read, which also bounds the regex work per line.
MAX_LINE_CHARS = 1_000
# go test prints one "ok" line per passing package; past this many they are counted.
MAX_OK_PACKAGES = 2

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")
# Maven and Gradle prefix every line with its level.
_LEVEL_RE = re.compile(r"^\[(?:ERROR|INFO|WARNING|WARN|DEBUG)\] ?")
_SPACES_RE = re.compile(r"\s{2,}|\t")
_AT_SUFFIX_RE = re.compile(r" \(at [^()]*(?:\([^()]*\)[^()]*)*\)$")


def _rules(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


# Each rule keeps its "keep" group, or the whole (stripped) line.
_FAILED = _rules(
    r"^(?:FAILED|ERROR) (?P<keep>\S+::\S+)",                        # pytest summary
    r"^(?P<keep>\S+::\S+) (?:FAILED|ERROR)\b",                      # pytest -v
    r"^(?:FAIL|ERROR): (?P<keep>[\w.]+ \([\w.]+\))",                # unittest, Django
    r"^(?P<keep>[\w.]+ \([\w.]+\)) \.\.\. (?:FAIL|ERROR)$",         # unittest -v
    r"^--- FAIL: (?P<keep>\S+) \([\d.]+s\)$",                       # go test
    r"^test (?P<keep>\S+) \.\.\. FAILED$",                          # cargo test
    r"^● (?!Test suite failed to run)(?P<keep>.+)$",                # jest
    r"^FAIL\s+(?P<keep>\S+ > .+)$",                                 # vitest
    r"^(?:\(fail\)|✗) (?P<keep>.+?)(?: \[[\d.]+m?s\])?$",           # bun test
    r"^(?P<keep>[\w.$]+?)(?:\((?P<cls>[\w.$]+)\))?\s+(?:--\s+)?Time elapsed: [\d.,]+ s(?:ec)?"
    r"\s+<<< (?:FAILURE|ERROR)!$",                                  # maven surefire
)
# mocha numbers its failures ("1) name"); only read as such beside its summary.
_MOCHA_FAILED_RE = re.compile(r"^(?P<n>\d+)\) (?P<keep>.+?):?$")
_MOCHA_SUMMARY_RE = re.compile(r"^\d+ failing$")

_RESULTS = _rules(
    # tests
    r"^=+ (?P<keep>(?:tests finished: )?\d+ (?:passed|failed|errors?|skipped|deselected|"
    r"xfailed|xpassed|warnings?)\b.*|no tests ran.*) =+$",         # pytest, sympy
    r"^(?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed)(?:, \d+ [\w ]+?)*|"
    r"no tests ran) in [\d.]+s\b.*$",                                # pytest -q
    r"^Ran \d+ tests? in [\d.]+s$", r"^OK(?: \([^)]*\))?$",          # unittest
    r"^FAILED \((?:failures|errors|skipped|expected failures|unexpected successes)=[^)]*\)$",
    r"^(?:Tests|Test Suites):\s+.+ total$",                          # jest
    r"^(?:Test Files|Tests)\s+\d+ (?:passed|failed|skipped|todo).*\(\d+\)$",  # vitest
    r"^\d+ (?:passing|failing|pending)(?: \(\d+m?s\))?$",            # mocha
    r"^\d+ (?:pass|fail|skip|todo)$",                                # bun test
    r"^Ran \d+ tests? across \d+ files?\.(?: \[[\d.]+m?s\])?$",
    r"^FAIL\s+\S+\s+(?:[\d.]+s|\[(?:build|setup) failed\])$",        # go test
    r"^test result: (?!ok\. 0 passed; 0 failed)(?:ok|FAILED)\. .+$",  # cargo test
    r"^(?P<keep>Tests run: \d+, Failures: \d+, Errors: \d+, Skipped: \d+)",  # surefire
    # builds, linters, type checkers
    r"^Found \d+ errors?\b.*$", r"^Success: no issues found.*$",     # tsc, mypy, ruff
    r"^All checks passed!$", r"^\d+ files? (?:reformatted|left unchanged|would be reformatted)"
    r"\b.*$", r"^\d+ errors?, \d+ warnings?, \d+ informations?\s*$",  # ruff format, pyright
    r"^✖ \d+ problems? \(.+\)$",                                    # eslint
    r"^\d+ (?:errors?|warnings?)$",                                  # javac
    r"^Finished .+ target\(s\) in .+$", r"^error: could not compile .+$",  # cargo
    r"^warning: .+ generated \d+ warnings?.*$",
    r"^BUILD (?:SUCCESS|FAILURE)$", r"^BUILD (?:SUCCESSFUL|FAILED) in .+$",  # maven, gradle
    # git
    r"^\[.+? [0-9a-f]{7,40}\] .+$",                                  # commit
    r"^\d+ files? changed(?:, \d+ insertions?\(\+\))?(?:, \d+ deletions?\(-\))?$",
    r"^[+ ]?[0-9a-f]{7,40}\.{2,3}[0-9a-f]{7,40}\s+\S+\s+->\s+\S+(?:\s+\(.+\))?$",  # push, fetch
    r"^\* \[new (?:branch|tag)\]\s+\S+\s+->\s+\S+$",
    r"^Merge made by the '\w+' strategy\.$", r"^Fast-forward$",
    r"^Updating [0-9a-f]{7,40}\.\.[0-9a-f]{7,40}$", r"^Already up[ -]to[ -]date\.?$",
    r"^Successfully rebased and updated \S+\.$", r"^Switched to (?:a new )?branch '.+'$",
    # HTTP
    r"^(?:< )?(?P<keep>HTTP/[\d.]+ \d{3}\b.*)$",
)
_GO_OK_RE = re.compile(r"^ok\s+\S+\s+(?:[\d.]+s|\(cached\)).*$")
_PULL_URL_RE = re.compile(r"https?://[^\s/]+/\S+?/(?:pull|pulls|merge_requests)/\d+\b")

# Diagnostics that name what is wrong and usually where: kept before any generic line.
_DIAGNOSTICS = _rules(
    r"^\S+\(\d+,\d+\): error TS\d+: .+$",                          # tsc
    r"^\S+:\d+:\d+ - error TS\d+: .+$",                              # tsc --pretty
    r"^\S+?:\d+:(?:\d+:)? error: .+$",                               # mypy, javac, gcc
    r"^\S+?:\d+:\d+: [A-Z]{1,4}\d{2,4}\b.+$",                        # ruff, flake8
    r"^\S+\.\w+:\[\d+,\d+\] .+$",                                    # maven compiler
    r"^\S+_test\.go:\d+: .+$",                                       # go test t.Error
    r"^curl: \(\d+\) .+$", r"^CONFLICT \(.+\): .+$",                 # curl, git merge
    r"^! \[(?:remote )?rejected\]\s+.+$",                            # git push
    r"^error: could not apply [0-9a-f]{7,40}\.\.\. .+$",             # git rebase
    r"^(?:/\S+/)?(?:ba|z|da)?sh: .*(?:not found|No such file or directory|Permission denied)$",
)
# rustc and ruff print a diagnostic, then its location on a " --> path:l:c" line.
# (kind, pattern): "error[E0382]:" is decisive as it stands; "error:" is the tool's
# own line until a location makes it a diagnostic; a warning or a ruff code line
# is kept only with its location.
_PENDING: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("decisive", re.compile(r"^error\[E?\d+\]: .+$")),
    ("generic", re.compile(r"^error: .+$")),
    ("warning", re.compile(r"^warning(?:\[\w+\])?: .+$")),
    ("lint", re.compile(r"^[A-Z]{1,4}\d{2,4} .+$")),
)
_ARROW_RE = re.compile(r"^-->\s+(?P<at>\S+:\d+(?::\d+)?)$")
# How far below its diagnostic rustc / ruff print the " --> " line.
ARROW_WINDOW = 3
_ESLINT_FILE_RE = re.compile(r"^(?:/|\.{0,2}/)?(?:[\w.@+-]+/)+[\w.@+-]+\.\w+$")
_ESLINT_ROW_RE = re.compile(r"^(?P<at>\d+:\d+)\s+(?P<kind>error|warning)\s+(?P<message>.+)$")
# A tool's own error line: npm, pnpm, yarn, git, maven, anything "error:".
_GENERIC = _rules(
    r"^npm (?:ERR!|error) (?! )(?P<keep>.+)$", r"^ERR_PNPM_\w+.*$", r"^ELIFECYCLE\s+.+$",
    r"^error (?!TS\d)\S.*$", r"^(?:fatal|error|ERROR|Error|FAILURE):\s*.+$",
    r"^Automatic merge failed; .+$", r"^Failed to execute goal .+$",
    r"^make(?:\[\d+\])?: \*\*\* .+$",
)
_BOILERPLATE_RE = re.compile(
    r"(?i)a complete log of this run|this is probably not a problem|additional logging output|"
    r"to see a list of scripts|^-> \[help \d+\]|^\[help \d+\]|to see the full stack trace|"
    r"re-run maven|for more information about the errors|please refer to|^hint: |"
    r"^(?:code|errno) \S+$|^exit status \d+$|run with --(?:stacktrace|info|debug|scan)")


@dataclass(frozen=True, slots=True)
class Findings:
    """What one output is worth keeping, each list in output order and deduplicated."""

    results: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    definitions: tuple[Definition, ...] = ()

    def lines(self, command: str = "") -> list[tuple[str, str]]:
        """(mark, text) per observation, in the log's wording."""
        where = f" in `{_one_line(command, MAX_COMMAND_CHARS)}`" if command else ""
        out: list[tuple[str, str]] = []
        if self.results:
            out.append((MEDIUM, f"Result{where}: "
                        + _one_line("; ".join(self.results), MAX_RESULT_CHARS)))
        if self.failed:
            out.append((MEDIUM, "Failed: " + _counted(self.failed, MAX_FAILED_TESTS)))
        out += [(MEDIUM, f"Error{where}: {_one_line(e, MAX_ERROR_CHARS)}") for e in self.errors]
        out += [(LOW, f"Warning{where}: {_one_line(w, MAX_ERROR_CHARS)}") for w in self.warnings]
        if self.definitions:
            out.append((MEDIUM, "Defined: " + "; ".join(str(d) for d in self.definitions)))
        return out


def observations(text: str, at: str, command: str = "") -> list[Observation]:
    """The observations one tool output adds to the log, stamped ``at``."""
    return [Observation(mark, at, line) for mark, line in findings(text, command).lines(command)]


def findings(text: str, command: str = "") -> Findings:
    """Results, failed tests, decisive errors, warnings and definitions in ``text``."""
    reader = _Reader(command)
    for index, raw in enumerate(text.splitlines()):
        reader.line(index, _clean(raw))
    return reader.close()


def _clean(raw: str) -> str:
    """The line as a terminal shows it: colours and a log level prefix gone, only
    what follows the last carriage return (a progress bar's final state)."""
    line = _ANSI_RE.sub("", raw[:MAX_LINE_CHARS]).rstrip()
    return _LEVEL_RE.sub("", line.rsplit("\r", 1)[-1])


@dataclass
class _Error:
    at: int  # output line index: errors are chosen in output order
    text: str
    kind: str  # "decisive", "generic", or awaiting a location: "warning", "lint"
    located: bool = True
    # Errors with one key are one error. A trace's key is its message alone: the
    # same message raised again under another name (Python's "During handling of
    # the above exception", a wrapper re-raising) is the same failure.
    key: str = ""


@dataclass
class _Reader:
    """One output's findings so far; ``line`` reads the next line, ``close`` ends."""

    command: str
    results: dict[str, None] = field(default_factory=dict)
    failed: dict[str, None] = field(default_factory=dict)
    mocha: dict[str, str] = field(default_factory=dict)  # failure number -> test name
    mocha_summary: bool = False
    go_ok: list[str] = field(default_factory=list)
    errors: list[_Error] = field(default_factory=list)
    definitions: dict[Definition, None] = field(default_factory=dict)
    eslint_file: str = ""

    def __post_init__(self) -> None:
        self.traces = TraceReader()
        self.listing = listing_of(self.command)

    def line(self, index: int, raw: str) -> None:
        if self.traces.feed(index, raw):
            return
        text = raw.strip()
        if not text or self._failed(text) or self._result(text):
            return
        if self._diagnostic(index, text) or self._generic(index, text):
            return
        found = definition(raw, self.listing)
        if found is not None:
            self.definitions.setdefault(found, None)

    def close(self) -> Findings:
        for trace in self.traces.close():
            self.errors.append(_Error(trace.at, str(trace), "decisive", key=_message(str(trace))))
        if self.mocha_summary:
            for name in self.mocha.values():
                self.failed.setdefault(name, None)
        results = list(self.results)
        if len(self.go_ok) > MAX_OK_PACKAGES:
            results.append(f"{len(self.go_ok)} packages ok")
        else:
            results += self.go_ok
        warnings = [e.text for e in self.errors if e.kind == "warning" and e.located]
        return Findings(tuple(_unittest(results)), tuple(self.failed), _chosen(self.errors),
                        tuple(dict.fromkeys(warnings))[:MAX_WARNINGS],
                        tuple(self.definitions)[:MAX_DEFINITIONS])

    def _failed(self, text: str) -> bool:
        for pattern in _FAILED:
            found = pattern.match(text)
            if found:
                name, cls = found.group("keep"), found.groupdict().get("cls")
                self.failed.setdefault(f"{cls}.{name}" if cls else name, None)
                return True
        mocha = _MOCHA_FAILED_RE.match(text)
        if mocha:
            self.mocha.setdefault(mocha.group("n"), mocha.group("keep"))
        return False

    def _result(self, text: str) -> bool:
        if _GO_OK_RE.match(text):
            self.go_ok.append(_squeezed(text))
            return True
        for pattern in _RESULTS:
            found = pattern.match(text)
            if found:
                self.results.setdefault(_squeezed(found.groupdict().get("keep") or text), None)
                self.mocha_summary = self.mocha_summary or bool(_MOCHA_SUMMARY_RE.match(text))
                return True
        url = _PULL_URL_RE.search(text)
        if url:
            self.results.setdefault(url.group(0), None)
        return bool(url)

    def _diagnostic(self, index: int, text: str) -> bool:
        arrow = _ARROW_RE.match(text)
        if arrow:
            self._locate(index, arrow.group("at"))
            return True
        if any(p.match(text) for p in _DIAGNOSTICS):
            self.errors.append(_Error(index, _squeezed(text), "decisive"))
            return True
        for kind, pattern in _PENDING:
            if pattern.match(text):
                if not _BOILERPLATE_RE.search(text):
                    self.errors.append(_Error(index, _squeezed(text), kind, located=False))
                return True
        return self._eslint(index, text)

    def _locate(self, index: int, where: str) -> None:
        """Give the diagnostic just above its " --> path:line:col" location."""
        last = self.errors[-1] if self.errors else None
        if last is None or last.located or index - last.at > ARROW_WINDOW:
            return
        last.text, last.located = f"{last.text} (at {where})", True
        if last.kind in ("generic", "lint"):
            last.kind = "decisive"

    def _eslint(self, index: int, text: str) -> bool:
        """eslint: a file's path on its own line, then "line:col  error  message  rule"."""
        row = _ESLINT_ROW_RE.match(text)
        if row and self.eslint_file:
            located = f"{self.eslint_file}:{row.group('at')} {_squeezed(row.group('message'))}"
            kind = "decisive" if row.group("kind") == "error" else "warning"
            self.errors.append(_Error(index, located, kind))
            return True
        if _ESLINT_FILE_RE.match(text):
            self.eslint_file = text
        return False

    def _generic(self, index: int, text: str) -> bool:
        for pattern in _GENERIC:
            found = pattern.match(text)
            if found:
                if not _BOILERPLATE_RE.search(found.groupdict().get("keep") or text):
                    self.errors.append(_Error(index, _squeezed(text), "generic"))
                return True
        return False


def _chosen(errors: list[_Error]) -> tuple[str, ...]:
    """The decisive errors (the first ones and the last) or, failing those, the
    tool's own error lines (the first and the last)."""
    decisive = [e for e in errors if e.kind == "decisive"]
    generic = [e for e in errors if e.kind == "generic"]
    pool, limit = (decisive, MAX_ERRORS) if decisive else (generic, MAX_GENERIC_ERRORS)
    by_key: dict[str, str] = {}
    for error in sorted(pool, key=lambda e: e.at):
        if error.key:  # a trace raised again: the last one stands, in its place
            by_key.pop(error.key, None)
            by_key[error.key] = error.text
        else:
            by_key.setdefault(error.text, error.text)
    texts = list(by_key.values())
    if len(texts) <= limit:
        return tuple(texts)
    return (*texts[: limit - 1], texts[-1])


def _message(error: str) -> str:
    """An error's message without the exception's name and the frame: what it says."""
    return _AT_SUFFIX_RE.sub("", error).split(": ", 1)[-1]


def _unittest(results: list[str]) -> list[str]:
    """unittest's two summary lines as one: ``Ran 3 tests; OK (skipped=1) (in 0.2s)``."""
    out: list[str] = []
    timing = ""
    for line in results:
        ran = re.match(r"Ran (\d+ tests?) in (\S+)$", line)
        if ran:
            out.append(f"Ran {ran.group(1)}")
            timing = f" (in {ran.group(2)})"
        elif out and out[-1].startswith("Ran ") and line.startswith(("OK", "FAILED")):
            out[-1] += f"; {line}{timing}"
        else:
            out.append(line)
    return out


def _counted(items: tuple[str, ...], limit: int) -> str:
    listed = list(items[:limit])
    rest = len(items) - len(listed)
    return "; ".join(listed) + (f" (+{rest} more)" if rest > 0 else "")


def _squeezed(text: str) -> str:
    return _SPACES_RE.sub(" ", text.strip())


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
