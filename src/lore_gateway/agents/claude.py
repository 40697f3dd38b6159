"""Claude Code: the one-run environment and the settings.json edit.

Claude Code takes its endpoint from ``ANTHROPIC_BASE_URL`` (a path prefix is kept)
and extra request headers from ``ANTHROPIC_CUSTOM_HEADERS`` ("Name: value" lines),
both from the environment or from the ``env`` object of
``~/.claude/settings.json``. Its requests then arrive as ``POST
<gateway>/v1/messages?beta=true`` with the user's own ``x-api-key`` or bearer token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.agents.codex import PROJECT_HEADER, SetupConflict

BASE_URL_ENV = "ANTHROPIC_BASE_URL"
HEADERS_ENV = "ANTHROPIC_CUSTOM_HEADERS"


def settings_path(home: Path | None = None) -> Path:
    return (home or Path.home()) / ".claude" / "settings.json"


def run_env(gateway_url: str, project: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """Environment additions that point one ``claude`` run at the gateway.

    The project header is appended to any custom headers the user already sends.
    """
    added = {BASE_URL_ENV: gateway_url.rstrip("/")}
    if project is not None:
        header = f"{PROJECT_HEADER}: {project}"
        existing = env.get(HEADERS_ENV, "").strip()
        added[HEADERS_ENV] = f"{existing}\n{header}" if existing else header
    return added


@dataclass(frozen=True, slots=True)
class SettingsEdit:
    """What ``apply_setup`` changed: the env value it set and the one it replaced."""

    value: str
    previous: str | None
    created_env: bool

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "previous": self.previous, "created_env": self.created_env}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SettingsEdit:
        previous = data.get("previous")
        return cls(
            value=str(data["value"]),
            previous=None if previous is None else str(previous),
            created_env=bool(data["created_env"]),
        )


def _load(text: str, what: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SetupConflict(f"{what} is not valid JSON ({exc}); fix it first") from exc
    if not isinstance(data, dict):
        raise SetupConflict(f"{what} is not a JSON object; fix it first")
    env = data.get("env")
    if env is not None and not isinstance(env, dict):
        raise SetupConflict(f'"env" in {what} is not an object; fix it first')
    return data


def _dump(data: dict[str, Any]) -> str:
    # Claude Code writes its settings with two-space indentation.
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def apply_setup(text: str, gateway_url: str) -> tuple[str, SettingsEdit]:
    """Set ``env.ANTHROPIC_BASE_URL`` to the gateway in settings.json text."""
    data = _load(text, "settings.json")
    env = data.get("env")
    created_env = env is None
    env = {} if env is None else env
    previous = env.get(BASE_URL_ENV)
    value = gateway_url.rstrip("/")
    env[BASE_URL_ENV] = value
    data["env"] = env
    return _dump(data), SettingsEdit(
        value, None if previous is None else str(previous), created_env
    )


def revert_setup(text: str, edit: SettingsEdit) -> str:
    """Take ``edit`` back out of settings.json text the user changed since setup.

    The user's other changes are kept (the file is re-serialised, so their
    formatting is normalised); if they changed lore's value itself, refuse.
    """
    data = _load(text, "settings.json")
    env = data.get("env")
    if not isinstance(env, dict) or env.get(BASE_URL_ENV) != edit.value:
        raise SetupConflict(f"env.{BASE_URL_ENV} is no longer the value lore set")
    if edit.previous is None:
        del env[BASE_URL_ENV]
    else:
        env[BASE_URL_ENV] = edit.previous
    if edit.created_env and not env:
        del data["env"]
    return _dump(data)


def points_at_gateway(text: str, gateway_url: str) -> bool:
    try:
        data = _load(text, "settings.json")
    except SetupConflict:
        return False
    env = data.get("env")
    if not isinstance(env, dict):
        return False
    return str(env.get(BASE_URL_ENV, "")).rstrip("/") == gateway_url.rstrip("/")
