"""Gemini CLI: the one-run environment and the ``~/.gemini/.env`` edit.

Gemini CLI (0.61) talks to the Gemini API through the google-genai SDK, which
takes its endpoint from ``GOOGLE_GEMINI_BASE_URL`` and sends ``POST
<base>/v1beta/models/{model}:streamGenerateContent?alt=sse`` with the user's
``GEMINI_API_KEY`` as ``x-goog-api-key``. Extra request headers come from
``GEMINI_CLI_CUSTOM_HEADERS`` (``Name: value`` entries joined by commas).

The base URL has no key in ``settings.json``: the CLI reads it from the
environment, or from the first ``.env`` file it finds walking up from the
working directory (``.gemini/.env`` before ``.env`` in each folder), ending at
``~/.gemini/.env``; a variable already in the environment wins. So ``lore run
gemini`` sets the variables and writes no file, while ``lore setup gemini``
writes them into ``~/.gemini/.env`` (``GEMINI_CLI_HOME`` in place of the home
folder when set), line by line, keeping the user's other lines;
``agents/setup_state.py`` keeps the byte backup and the exact undo. A project's
own ``.env`` on the way up shadows that file.

The gateway forwards the Gemini API, so the CLI must sign in with an API key
(``security.auth.selectedType: "gemini-api-key"``, what it saves when you pick
"Use Gemini API key"). Its Google sign-in talks to another service (Code
Assist), which the gateway does not forward.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lore_gateway.agents.codex import GATEWAY_KEY_HEADER, PROJECT_HEADER, SetupConflict

BASE_URL_ENV = "GOOGLE_GEMINI_BASE_URL"
HEADERS_ENV = "GEMINI_CLI_CUSTOM_HEADERS"
HOME_ENV = "GEMINI_CLI_HOME"
# ``KEY=value``, optionally ``export KEY=value``, as dotenv reads a line.
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$")


def env_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    home = env.get(HOME_ENV) or env.get("HOME") or str(Path.home())
    return Path(home) / ".gemini" / ".env"


def base_url(gateway_url: str) -> str:
    return gateway_url.rstrip("/")


def _with_headers(existing: str | None, entries: list[str]) -> str:
    existing = (existing or "").strip()
    return ", ".join([existing, *entries] if existing else entries)


def run_env(gateway_url: str, project: str | None, env: Mapping[str, str],
            gateway_key: str | None = None) -> dict[str, str]:
    """Environment additions that point one ``gemini`` run at the gateway.

    The project header (and in team mode the gateway key) is appended to the
    custom headers the user already sends. A project path with a comma cannot
    travel there (the CLI splits the entries at commas): the gateway then reads
    the project from the CLI's own context text.
    """
    added = {BASE_URL_ENV: base_url(gateway_url)}
    entries = []
    if project is not None and "," not in project:
        entries.append(f"{PROJECT_HEADER}: {project}")
    if gateway_key is not None:
        entries.append(f"{GATEWAY_KEY_HEADER}: {gateway_key}")
    if entries:
        added[HEADERS_ENV] = _with_headers(env.get(HEADERS_ENV), entries)
    return added


# --- persistent ~/.gemini/.env edit --------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnvEdit:
    """What ``apply_setup`` changed: each variable's line as lore wrote it and
    the line it replaced (None: added at the end)."""

    lines: tuple[tuple[str, str, str | None], ...]  # (name, written, previous)

    def to_json(self) -> dict[str, object]:
        return {"lines": [list(line) for line in self.lines]}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> EnvEdit:
        raw = data["lines"]
        assert isinstance(raw, list)
        return cls(tuple((str(n), str(w), None if p is None else str(p)) for n, w, p in raw))


def _find(lines: list[str], name: str) -> int | None:
    """The index of the last line assigning ``name`` (dotenv's last one wins)."""
    found = None
    for index, line in enumerate(lines):
        match = _ASSIGNMENT.match(line)
        if match is not None and match.group(1) == name:
            found = index
    return found


def _value(line: str) -> str:
    match = _ASSIGNMENT.match(line)
    value = match.group(2).strip() if match is not None else ""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value.split(" #", 1)[0].strip()


def _line(name: str, value: str) -> str:
    return f'{name}="{value}"' if any(c in value for c in " #,'\"") else f"{name}={value}"


def apply_setup(text: str, gateway_url: str,
                gateway_key: str | None = None) -> tuple[str, EnvEdit]:
    """Set ``GOOGLE_GEMINI_BASE_URL`` to the gateway in ``.env`` text (and, in
    team mode, add the gateway key to ``GEMINI_CLI_CUSTOM_HEADERS``); a value
    the user set is replaced where it stands and kept for the undo."""
    lines = text.splitlines()
    wanted = [(BASE_URL_ENV, base_url(gateway_url))]
    if gateway_key is not None:
        at = _find(lines, HEADERS_ENV)
        old = None if at is None else _value(lines[at])
        wanted.append((HEADERS_ENV, _with_headers(old, [f"{GATEWAY_KEY_HEADER}: {gateway_key}"])))
    edits: list[tuple[str, str, str | None]] = []
    for name, value in wanted:
        written = _line(name, value)
        at = _find(lines, name)
        if at is None:
            lines.append(written)
            edits.append((name, written, None))
        else:
            edits.append((name, written, lines[at]))
            lines[at] = written
    return "\n".join(lines) + "\n", EnvEdit(tuple(edits))


def revert_setup(text: str, edit: EnvEdit) -> str:
    """Take ``edit`` back out of ``.env`` text the user changed since setup,
    keeping their other lines; refuse if they changed lore's lines."""
    lines = text.splitlines()
    for name, written, previous in reversed(edit.lines):
        at = _find(lines, name)
        if at is None or lines[at] != written:
            raise SetupConflict(f"the {name} line is no longer the one lore wrote")
        if previous is None:
            del lines[at]
        else:
            lines[at] = previous
    return "\n".join(lines) + "\n" if lines else ""


def points_at_gateway(text: str, gateway_url: str) -> bool:
    lines = text.splitlines()
    at = _find(lines, BASE_URL_ENV)
    return at is not None and _value(lines[at]).rstrip("/") == base_url(gateway_url)
