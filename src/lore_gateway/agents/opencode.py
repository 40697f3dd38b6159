"""OpenCode: the one-run inline config and the opencode.json edit.

OpenCode (1.18) talks to each provider through the AI SDK, whose base URL it
takes from ``provider.<id>.options.baseURL`` in its config; request headers come
from ``provider.<id>.options.headers``. Its Anthropic provider then sends
``POST <baseURL>/messages`` and its OpenAI provider ``POST <baseURL>/responses``,
with the user's own ``x-api-key`` or bearer key, so both base URLs are
``<gateway>/v1``. Each request carries OpenCode's session as ``x-session-id``.

Where it reads config (later sources win, objects are merged key by key): the
global ``~/.config/opencode/opencode.json`` then ``opencode.jsonc`` (both JSON
with comments), ``OPENCODE_CONFIG`` (a file), a project's ``opencode.json``, and
last ``OPENCODE_CONFIG_CONTENT`` (the config itself, as text). So ``lore run
opencode`` passes the providers in ``OPENCODE_CONFIG_CONTENT`` and touches no
file, while ``lore setup opencode`` edits the global file as text
(``agents/jsonc.py``), keeping the user's comments; ``agents/setup_state.py``
keeps the byte backup and the exact undo.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.agents import jsonc
from lore_gateway.agents.codex import GATEWAY_KEY_HEADER, PROJECT_HEADER, SetupConflict

# The providers pointed at the gateway: the two APIs it forwards that OpenCode uses.
PROVIDERS = ("anthropic", "openai")
CONFIG_CONTENT_ENV = "OPENCODE_CONFIG_CONTENT"
# The global files, in the order OpenCode reads them (the later wins a conflict).
CONFIG_FILES = ("opencode.json", "opencode.jsonc")


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "opencode"


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """The global file ``lore setup opencode`` edits: the ``.jsonc`` one when it
    exists (OpenCode reads it last, so its providers win), else ``opencode.json``."""
    folder = config_dir(env)
    jsonc_file = folder / CONFIG_FILES[1]
    return jsonc_file if jsonc_file.is_file() else folder / CONFIG_FILES[0]


def base_url(gateway_url: str) -> str:
    return gateway_url.rstrip("/") + "/v1"


def _leaves(gateway_url: str, headers: Mapping[str, str]) -> list[tuple[list[str], str]]:
    """Every value lore sets: (path from the top, value)."""
    leaves = []
    for provider in PROVIDERS:
        options = ["provider", provider, "options"]
        leaves.append(([*options, "baseURL"], base_url(gateway_url)))
        leaves += [([*options, "headers", name], value) for name, value in headers.items()]
    return leaves


def _merge(into: dict[str, Any], tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` merged into a copy of ``into`` key by key, as OpenCode merges configs."""
    merged = dict(into)
    for key, value in tree.items():
        old = merged.get(key)
        merged[key] = (_merge(old, value) if isinstance(old, dict) and isinstance(value, dict)
                       else value)
    return merged


def provider_config(gateway_url: str, gateway_key: str | None = None,
                    headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The config lore adds, as an object (``lore setup --print opencode``); in team
    mode the gateway key travels as a header."""
    headers = dict(headers or {})
    if gateway_key is not None:
        headers[GATEWAY_KEY_HEADER] = gateway_key
    tree: dict[str, Any] = {}
    for path, value in _leaves(gateway_url, headers):
        tree = _merge(tree, _nested(path, value))
    return tree


def run_env(gateway_url: str, project: str | None, env: Mapping[str, str],
            gateway_key: str | None = None) -> dict[str, str]:
    """Environment additions that point one ``opencode`` run at the gateway.

    The providers go in ``OPENCODE_CONFIG_CONTENT``, merged into the user's own
    value of it when they set one (raises ``jsonc.JsoncError`` when that is not
    a JSON object).
    """
    headers = {} if project is None else {PROJECT_HEADER: project}
    tree = provider_config(gateway_url, gateway_key, headers)
    existing = env.get(CONFIG_CONTENT_ENV, "").strip()
    try:
        user: Any = jsonc.loads(existing) if existing else {}
    except jsonc.JsoncError as exc:
        raise jsonc.JsoncError(f"{CONFIG_CONTENT_ENV} is not valid JSON ({exc})") from exc
    if not isinstance(user, dict):
        raise jsonc.JsoncError(f"{CONFIG_CONTENT_ENV} is not a JSON object")
    return {CONFIG_CONTENT_ENV: json.dumps(_merge(user, tree), ensure_ascii=False)}


def _nested(path: Sequence[str], value: Any) -> dict[str, Any]:
    for key in reversed(path[1:]):
        value = {key: value}
    return {path[0]: value}


# --- persistent opencode.json edit ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One member lore added or replaced: where, what it holds, what it replaced."""

    path: tuple[str, ...]
    value: Any  # the member's value right after this step
    previous: str | None  # the source text of the value it replaced (None: added)


@dataclass(frozen=True, slots=True)
class ConfigEdit:
    """What ``apply_setup`` changed, step by step, so ``revert_setup`` can take
    exactly it back (in reverse)."""

    steps: tuple[Step, ...]

    def to_json(self) -> dict[str, object]:
        return {"steps": [{"path": list(s.path), "value": s.value, "previous": s.previous}
                          for s in self.steps]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConfigEdit:
        return cls(tuple(Step(tuple(s["path"]), s["value"], s["previous"])
                         for s in data["steps"]))


def _parse(text: str, what: str) -> jsonc.Node:
    try:
        node = jsonc.parse(text)
    except jsonc.JsoncError as exc:
        raise SetupConflict(f"{what} is not valid JSON or JSONC ({exc}); fix it first") from exc
    if node.members is None:
        raise SetupConflict(f"{what} is not a JSON object; fix it first")
    return node


def apply_setup(text: str, gateway_url: str, gateway_key: str | None = None,
                what: str = "opencode.json") -> tuple[str, ConfigEdit]:
    """Point the Anthropic and OpenAI providers in ``text`` at the gateway.

    The file is edited as text (comments, order and layout survive); a base URL
    the user set is replaced and kept for the undo. In team mode the gateway key
    is added to each provider's headers.
    """
    if not text.strip():
        text = "{}\n"
    _parse(text, what)
    headers = {} if gateway_key is None else {GATEWAY_KEY_HEADER: gateway_key}
    steps = []
    for path, value in _leaves(gateway_url, headers):
        try:
            text, where, previous = jsonc.set_member(text, path, value)
        except jsonc.JsoncError as exc:
            raise SetupConflict(f"cannot set {'.'.join(path)} in {what}: {exc}") from exc
        node = jsonc.find(jsonc.parse(text), where)
        assert node is not None
        steps.append(Step(tuple(where), node.data(), previous))
    data = _parse(text, f"the edited {what}").data()
    if any(_get(data, path) != value for path, value in _leaves(gateway_url, headers)):
        raise SetupConflict(f"could not point {what} at the gateway; edit it by hand")
    return text, ConfigEdit(tuple(steps))


def _get(data: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def revert_setup(text: str, edit: ConfigEdit, what: str = "opencode.json") -> str:
    """Take ``edit`` back out of ``text`` that the user changed since setup, keeping
    their other changes (and comments); refuse if they changed lore's members."""
    _parse(text, what)
    for step in reversed(edit.steps):
        node = jsonc.find(jsonc.parse(text), step.path)
        if node is None or node.data() != step.value:
            raise SetupConflict(f"{'.'.join(step.path)} is no longer what lore wrote")
        if step.previous is None:
            text = jsonc.delete_member(text, step.path)
        else:
            text = jsonc.replace_value(text, step.path, step.previous)
    return text


def points_at_gateway(text: str, gateway_url: str) -> bool:
    """Whether a provider lore sets up has its base URL on the gateway."""
    try:
        data = jsonc.loads(text)
    except jsonc.JsoncError:
        return False
    return any(_get(data, ["provider", p, "options", "baseURL"]) == base_url(gateway_url)
               for p in PROVIDERS)
