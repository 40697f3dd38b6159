"""Codex CLI: auth-mode detection, one-run ``-c`` overrides and the config.toml edit.

Codex 0.171 ignores ``OPENAI_BASE_URL``, so the gateway is reached through a
custom model provider named ``lore`` (``wire_api = "responses"``). Where its
requests go depends on how the user logged in:

* ChatGPT login: ``<gateway>/backend-api/codex`` with ``requires_openai_auth =
  true``, so Codex sends its ChatGPT access token and ``chatgpt-account-id`` and the
  gateway forwards to chatgpt.com's Codex backend.
* API key stored by ``codex login --api-key``: ``<gateway>/v1`` with
  ``requires_openai_auth = true``, so Codex sends the stored key, just as its
  built-in ``openai`` provider would.
* Otherwise: ``<gateway>/v1`` with ``env_key = "OPENAI_API_KEY"``.

Custom providers never try a WebSocket (``supports_websockets`` defaults to false),
so no 426 round trip is needed. ``model_providers.openai`` itself cannot be
overridden (Codex: "Built-in providers cannot be overridden").
"""

from __future__ import annotations

import enum
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROVIDER_ID = "lore"
PROJECT_HEADER = "X-Lore-Project"
# Team mode (LORE_TENANCY=keys): the gateway key, and where `lore run` / `lore setup`
# find the user's own key. The gateway strips the header before forwarding.
GATEWAY_KEY_HEADER = "X-Lore-Key"
GATEWAY_KEY_ENV = "LORE_KEY"
SETUP_COMMENT = "# Added by `lore setup codex`; remove with `lore setup --undo codex`."
_PROVIDER_LINE = f'model_provider = "{PROVIDER_ID}"'


class AuthMode(enum.Enum):
    CHATGPT = "chatgpt"
    API_KEY_FILE = "api-key (auth.json)"
    API_KEY_ENV = "api-key (OPENAI_API_KEY)"


class SetupConflict(Exception):
    """The config cannot be edited or restored without losing the user's changes."""


def codex_home(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    value = env.get("CODEX_HOME")
    return Path(value) if value else Path.home() / ".codex"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    return codex_home(env) / "config.toml"


def detect_auth_mode(env: Mapping[str, str] | None = None) -> AuthMode:
    """How Codex will authenticate, from ``$CODEX_HOME/auth.json``.

    ``auth_mode`` is authoritative when present; older files only hold ``tokens``
    (ChatGPT) or ``OPENAI_API_KEY``. A missing or unreadable file means the key must
    come from the environment.
    """
    try:
        data = json.loads((codex_home(env) / "auth.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return AuthMode.API_KEY_ENV
    if not isinstance(data, dict):
        return AuthMode.API_KEY_ENV
    mode = str(data.get("auth_mode") or "").lower()
    if mode == "chatgpt":
        return AuthMode.CHATGPT
    if mode == "apikey" or data.get("OPENAI_API_KEY"):
        return AuthMode.API_KEY_FILE
    if data.get("tokens"):
        return AuthMode.CHATGPT
    return AuthMode.API_KEY_ENV


def provider_base_url(gateway_url: str, mode: AuthMode) -> str:
    gateway_url = gateway_url.rstrip("/")
    if mode is AuthMode.CHATGPT:
        return f"{gateway_url}/backend-api/codex"
    return f"{gateway_url}/v1"


def provider_table(
    gateway_url: str, mode: AuthMode, project: str | None = None, *,
    gateway_key: str | None = None, gateway_key_env: str | None = None,
) -> dict[str, object]:
    """The ``[model_providers.lore]`` table, in the order it is written.

    A team-mode gateway key travels as a header: ``gateway_key`` writes it into
    ``http_headers`` (the persistent setup), ``gateway_key_env`` names the
    environment variable Codex reads it from (``env_http_headers``, so one run's
    key never appears on a command line).
    """
    table: dict[str, object] = {
        "name": "lore",
        "base_url": provider_base_url(gateway_url, mode),
        "wire_api": "responses",
    }
    if mode is AuthMode.API_KEY_ENV:
        table["env_key"] = "OPENAI_API_KEY"
    else:
        table["requires_openai_auth"] = True
    headers: dict[str, object] = {}
    if project is not None:
        headers[PROJECT_HEADER] = project
    if gateway_key is not None:
        headers[GATEWAY_KEY_HEADER] = gateway_key
    if headers:
        table["http_headers"] = headers
    if gateway_key_env is not None:
        table["env_http_headers"] = {GATEWAY_KEY_HEADER: gateway_key_env}
    return table


# --- TOML values ------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_value(key)


def toml_value(value: object) -> str:
    """TOML for the few value kinds we write: str, bool, int, and inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # A JSON string is a valid TOML basic string: both escape ", \ and control
        # characters, and TOML accepts JSON's \uXXXX escapes.
        return json.dumps(value)
    if isinstance(value, dict):
        items = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def run_overrides(gateway_url: str, mode: AuthMode, project: str | None,
                  gateway_key_env: str | None = None) -> list[str]:
    """``codex`` arguments that select the gateway for this run only."""
    table = provider_table(gateway_url, mode, project, gateway_key_env=gateway_key_env)
    return [
        "-c", f"model_providers.{PROVIDER_ID}={toml_value(table)}",
        "-c", f"model_provider={toml_value(PROVIDER_ID)}",
    ]


# --- persistent config.toml edit -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigEdit:
    """What ``apply_setup`` changed, so that ``revert_setup`` can take exactly it back."""

    provider_line: str  # the line we wrote for model_provider
    replaced_line: str | None  # the user's own model_provider line it replaced
    block: str  # the appended [model_providers.lore] block, leading newline included

    def to_json(self) -> dict[str, str | None]:
        return {
            "provider_line": self.provider_line,
            "replaced_line": self.replaced_line,
            "block": self.block,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ConfigEdit:
        replaced = data.get("replaced_line")
        return cls(
            provider_line=str(data["provider_line"]),
            replaced_line=None if replaced is None else str(replaced),
            block=str(data["block"]),
        )


_TOP_LEVEL_PROVIDER = re.compile(r"^[ \t]*model_provider[ \t]*=.*$")
_TABLE_HEADER = re.compile(r"^[ \t]*\[")


def _top_level_provider_line(lines: list[str]) -> int | None:
    for index, line in enumerate(lines):
        if _TABLE_HEADER.match(line):
            return None
        if _TOP_LEVEL_PROVIDER.match(line.rstrip("\r\n")):
            return index
    return None


def _parse(text: str, what: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SetupConflict(f"{what} is not valid TOML ({exc}); fix it first") from exc


def apply_setup(text: str, gateway_url: str, mode: AuthMode,
                gateway_key: str | None = None) -> tuple[str, ConfigEdit]:
    """Point ``config.toml`` text at the gateway; return the new text and the edit.

    The user's file is edited as text, not re-serialised, so comments and layout
    survive: one top-level ``model_provider`` line (replacing the user's own, if
    any) and one appended ``[model_providers.lore]`` table.
    """
    existing = _parse(text, "config.toml")
    providers = existing.get("model_providers")
    if isinstance(providers, dict) and PROVIDER_ID in providers:
        raise SetupConflict(
            f"config.toml already defines [model_providers.{PROVIDER_ID}]; remove it "
            "(or run `lore setup --undo codex` if lore wrote it) and try again"
        )
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    provider_line = f"{_PROVIDER_LINE}{newline}"
    index = _top_level_provider_line(lines)
    replaced: str | None = None
    if index is None:
        lines.insert(0, provider_line)
    else:
        replaced = lines[index]
        lines[index] = provider_line
    body = "".join(lines)
    # One blank line between the user's last line and ours.
    if not body:
        separator = ""
    elif body.endswith("\n"):
        separator = newline
    else:
        separator = newline + newline
    table = provider_table(gateway_url, mode, gateway_key=gateway_key)
    block_lines = [SETUP_COMMENT, f"[model_providers.{PROVIDER_ID}]"]
    block_lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    block = separator + newline.join(block_lines) + newline
    new_text = body + block
    parsed = _parse(new_text, "the edited config.toml")
    if parsed.get("model_provider") != PROVIDER_ID:
        raise SetupConflict("could not set model_provider in config.toml; edit it by hand")
    return new_text, ConfigEdit(provider_line, replaced, block)


def revert_setup(text: str, edit: ConfigEdit) -> str:
    """Take ``edit`` back out of ``text`` that the user has changed since setup.

    Both pieces lore wrote must still be present verbatim; otherwise the user has
    edited lore's own lines and guessing would risk their changes.
    """
    if edit.block not in text:
        raise SetupConflict(
            f"the [model_providers.{PROVIDER_ID}] block lore added has been edited"
        )
    text = text.replace(edit.block, "", 1)
    lines = text.splitlines(keepends=True)
    index = _top_level_provider_line(lines)
    if index is None or lines[index] != edit.provider_line:
        raise SetupConflict("the model_provider line lore wrote has been edited")
    if edit.replaced_line is None:
        del lines[index]
    else:
        lines[index] = edit.replaced_line
    return "".join(lines)


def points_at_gateway(text: str, gateway_url: str) -> bool:
    """Whether this config.toml selects a provider whose base_url is the gateway."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    provider_id = data.get("model_provider")
    providers = data.get("model_providers")
    if not isinstance(provider_id, str) or not isinstance(providers, dict):
        return False
    provider = providers.get(provider_id)
    if not isinstance(provider, dict):
        return False
    base_url = str(provider.get("base_url", ""))
    return base_url.startswith(gateway_url.rstrip("/") + "/")
