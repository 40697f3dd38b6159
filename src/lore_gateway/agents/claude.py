"""Claude Code: the one-run environment and the settings.json edit.

Claude Code takes its endpoint from ``ANTHROPIC_BASE_URL`` (a path prefix is kept)
and extra request headers from ``ANTHROPIC_CUSTOM_HEADERS`` ("Name: value" lines),
both from the environment or from the ``env`` object of
``~/.claude/settings.json``. Its requests then arrive as ``POST
<gateway>/v1/messages?beta=true`` with the user's own ``x-api-key`` or bearer token.

Both also set ``DISABLE_AUTO_COMPACT=1`` (unless the user set it): the gateway
manages the context window, so Claude Code's own auto-compaction, which
replaces the history with a model-written summary, is off; ``/compact`` keeps
working and is answered from memory (docs/context.md, "Compaction").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.agents.codex import GATEWAY_KEY_HEADER, PROJECT_HEADER, SetupConflict

BASE_URL_ENV = "ANTHROPIC_BASE_URL"
HEADERS_ENV = "ANTHROPIC_CUSTOM_HEADERS"
AUTO_COMPACT_ENV = "DISABLE_AUTO_COMPACT"


def settings_path(home: Path | None = None) -> Path:
    return (home or Path.home()) / ".claude" / "settings.json"


def run_env(gateway_url: str, project: str | None, env: Mapping[str, str],
            gateway_key: str | None = None) -> dict[str, str]:
    """Environment additions that point one ``claude`` run at the gateway.

    The project header (and in team mode the gateway key) is appended to any
    custom headers the user already sends.
    """
    added = {BASE_URL_ENV: gateway_url.rstrip("/")}
    if AUTO_COMPACT_ENV not in env:
        added[AUTO_COMPACT_ENV] = "1"
    headers = []
    if project is not None:
        headers.append(f"{PROJECT_HEADER}: {project}")
    if gateway_key is not None:
        headers.append(f"{GATEWAY_KEY_HEADER}: {gateway_key}")
    if headers:
        added[HEADERS_ENV] = _with_headers(env.get(HEADERS_ENV), headers)
    return added


def _with_headers(existing: str | None, lines: list[str]) -> str:
    existing = (existing or "").strip()
    return "\n".join([existing, *lines] if existing else lines)


@dataclass(frozen=True, slots=True)
class SettingsEdit:
    """What ``apply_setup`` changed: the env value it set and the one it replaced."""

    value: str
    previous: str | None
    created_env: bool
    # Team mode: the ANTHROPIC_CUSTOM_HEADERS value lore set (None: left alone).
    headers_value: str | None = None
    headers_previous: str | None = None
    # Whether lore added DISABLE_AUTO_COMPACT=1 (False: the user had their own).
    auto_compact_set: bool = False

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "previous": self.previous, "created_env": self.created_env,
                "headers_value": self.headers_value, "headers_previous": self.headers_previous,
                "auto_compact_set": self.auto_compact_set}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SettingsEdit:
        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        return cls(value=str(data["value"]), previous=text("previous"),
                   created_env=bool(data["created_env"]), headers_value=text("headers_value"),
                   headers_previous=text("headers_previous"),
                   auto_compact_set=bool(data.get("auto_compact_set", False)))


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


def apply_setup(text: str, gateway_url: str,
                gateway_key: str | None = None) -> tuple[str, SettingsEdit]:
    """Set ``env.ANTHROPIC_BASE_URL`` to the gateway in settings.json text, and
    ``env.DISABLE_AUTO_COMPACT`` unless present (and, in team mode, add the gateway
    key to ``env.ANTHROPIC_CUSTOM_HEADERS``)."""
    data = _load(text, "settings.json")
    env = data.get("env")
    created_env = env is None
    env = {} if env is None else env
    previous = env.get(BASE_URL_ENV)
    value = gateway_url.rstrip("/")
    env[BASE_URL_ENV] = value
    headers_value = headers_previous = None
    if gateway_key is not None:
        old = env.get(HEADERS_ENV)
        headers_previous = None if old is None else str(old)
        headers_value = _with_headers(headers_previous, [f"{GATEWAY_KEY_HEADER}: {gateway_key}"])
        env[HEADERS_ENV] = headers_value
    auto_compact_set = AUTO_COMPACT_ENV not in env
    if auto_compact_set:
        env[AUTO_COMPACT_ENV] = "1"
    data["env"] = env
    return _dump(data), SettingsEdit(
        value, None if previous is None else str(previous), created_env, headers_value,
        headers_previous, auto_compact_set,
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
    if edit.headers_value is not None and env.get(HEADERS_ENV) != edit.headers_value:
        raise SetupConflict(f"env.{HEADERS_ENV} is no longer the value lore set")
    if edit.previous is None:
        del env[BASE_URL_ENV]
    else:
        env[BASE_URL_ENV] = edit.previous
    if edit.headers_value is not None:
        if edit.headers_previous is None:
            del env[HEADERS_ENV]
        else:
            env[HEADERS_ENV] = edit.headers_previous
    if edit.auto_compact_set and env.get(AUTO_COMPACT_ENV) == "1":
        del env[AUTO_COMPACT_ENV]
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
