"""Persistent agent setup with an exact undo.

``setup`` writes the agent's config file and, before touching it, keeps under
``<data_dir>/setup/<agent>/`` a byte copy of the original (or the fact that there
was none) plus a record of exactly what lore changed. ``undo`` then:

* restores the original bytes (or deletes the file) when the file is still exactly
  what lore wrote, so ``setup`` + ``undo`` is byte-identical;
* when the user has edited the file since, takes out only lore's own change and
  keeps theirs (a merge), provided lore's lines are still there verbatim;
* otherwise refuses, says why, and points at the backup; nothing is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lore_gateway.agents import claude, codex, gemini, mcp_clients, opencode
from lore_gateway.agents.codex import SetupConflict

# Agents lore sits in front of (`lore run`, `lore doctor`'s agent checks).
AGENTS = ("codex", "claude", "opencode", "gemini")
# Everything `lore setup` configures: those, then MCP clients that start `lore mcp`
# (mcp_clients.py), which need no gateway.
TARGETS = (*AGENTS, *mcp_clients.CLIENTS)
NEW_FILE_MODE = 0o600


@dataclass(frozen=True, slots=True)
class AgentStatus:
    agent: str
    path: Path
    exists: bool
    set_up_by_lore: bool
    points_at_gateway: bool


def target_path(agent: str, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if agent == "codex":
        return codex.config_path(env)
    if agent == "claude":
        home = env.get("HOME")
        return claude.settings_path(Path(home) if home else None)
    if agent == "opencode":
        return opencode.config_path(env)
    if agent == "gemini":
        return gemini.env_path(env)
    if agent in mcp_clients.CLIENTS:
        return mcp_clients.config_path(agent, env)
    raise ValueError(f"unknown agent {agent!r}: expected one of {', '.join(TARGETS)}")


def _state_dir(data_dir: Path, agent: str) -> Path:
    return data_dir / "setup" / agent


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a config."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".lore-tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _apply(agent: str, text: str, gateway_url: str, env: Mapping[str, str],
           gateway_key: str | None) -> tuple[str, Any]:
    if agent == "codex":
        return codex.apply_setup(text, gateway_url, codex.detect_auth_mode(env), gateway_key)
    if agent == "opencode":
        return opencode.apply_setup(text, gateway_url, gateway_key,
                                    target_path(agent, env).name)
    if agent == "gemini":
        return gemini.apply_setup(text, gateway_url, gateway_key)
    if agent in mcp_clients.CLIENTS:
        return mcp_clients.apply_setup(text, mcp_clients.server_entry(agent, env, gateway_key),
                                       target_path(agent, env).name)
    return claude.apply_setup(text, gateway_url, gateway_key)


def _revert(agent: str, text: str, edit: Mapping[str, Any]) -> str:
    if agent == "codex":
        return codex.revert_setup(text, codex.ConfigEdit.from_json(edit))
    if agent == "opencode":
        return opencode.revert_setup(text, opencode.ConfigEdit.from_json(edit))
    if agent == "gemini":
        return gemini.revert_setup(text, gemini.EnvEdit.from_json(edit))
    if agent in mcp_clients.CLIENTS:
        return mcp_clients.revert_setup(text, mcp_clients.ServerEdit.from_json(edit), agent)
    return claude.revert_setup(text, claude.SettingsEdit.from_json(edit))


def _points_at(agent: str, text: str, gateway_url: str) -> bool:
    if agent == "codex":
        return codex.points_at_gateway(text, gateway_url)
    if agent == "opencode":
        return opencode.points_at_gateway(text, gateway_url)
    if agent == "gemini":
        return gemini.points_at_gateway(text, gateway_url)
    if agent in mcp_clients.CLIENTS:
        return mcp_clients.has_server(text)  # `lore mcp` opens the memory itself
    return claude.points_at_gateway(text, gateway_url)


def setup(
    agent: str, data_dir: Path, gateway_url: str, env: Mapping[str, str] | None = None,
    gateway_key: str | None = None,
) -> Path:
    """Point ``agent``'s config at the gateway; return the file written.

    ``gateway_key`` (team mode) is written into the agent's config as a header.
    """
    env = os.environ if env is None else env
    path = target_path(agent, env)
    state_dir = _state_dir(data_dir, agent)
    if (state_dir / "state.json").exists():
        raise SetupConflict(
            f"{agent} is already set up by lore ({path}); run `lore setup --undo {agent}` first"
        )
    original = _read(path)
    try:
        text = "" if original is None else original.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SetupConflict(f"{path} is not UTF-8 text; fix it first") from exc
    new_text, edit = _apply(agent, text, gateway_url, env, gateway_key)
    new_bytes = new_text.encode("utf-8")

    created_dir = not path.parent.exists()
    mode = NEW_FILE_MODE if original is None else path.stat().st_mode & 0o777
    state = {
        "agent": agent,
        "path": str(path),
        "existed": original is not None,
        "created_dir": created_dir,
        "mode": mode,
        "original_sha256": None if original is None else _sha256(original),
        "written_sha256": _sha256(new_bytes),
        "edit": edit.to_json(),
    }
    # The backup and the record go first: if we crash after this, undo still works.
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if original is not None:
        _atomic_write(state_dir / "original", original, 0o600)
    _atomic_write(state_dir / "state.json", json.dumps(state, indent=2).encode(), 0o600)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, new_bytes, mode)
    return path


def undo(agent: str, data_dir: Path, env: Mapping[str, str] | None = None) -> str:
    """Take lore's setup back out of ``agent``'s config; return what was done."""
    return _undo(agent, data_dir, write=True)


def undo_plan(agent: str, data_dir: Path) -> str | None:
    """What ``undo`` would do, in the imperative, without writing anything (None:
    ``agent`` was not set up by lore). Raises ``SetupConflict`` where ``undo`` would,
    so a dry run refuses what the real run would refuse (``lore uninstall``)."""
    if not (_state_dir(data_dir, agent) / "state.json").exists():
        return None
    return _undo(agent, data_dir, write=False)


def set_up_agents(data_dir: Path) -> list[str]:
    """The agents whose setup lore recorded (and can undo), in ``TARGETS`` order."""
    return [a for a in TARGETS if (_state_dir(data_dir, a) / "state.json").exists()]


def _undo(agent: str, data_dir: Path, *, write: bool) -> str:
    """``undo`` itself (``write``), or what it would do (the same decision, told
    in the imperative)."""
    state_dir = _state_dir(data_dir, agent)
    try:
        state = json.loads((state_dir / "state.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SetupConflict(f"{agent} was not set up by lore; nothing to undo") from None
    path = Path(state["path"])
    original = _read(state_dir / "original") if state["existed"] else None
    if state["existed"] and original is None:
        raise SetupConflict(f"the backup of {path} is missing from {state_dir}; restore by hand")
    current = _read(path)
    current_sha = None if current is None else _sha256(current)

    if current_sha == state["written_sha256"] or current_sha == state["original_sha256"]:
        # Untouched since setup (or setup never got to write it): restore exactly.
        if original is None:
            if not write:
                return f"remove {path} (it did not exist before setup)"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if state.get("created_dir"):
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
            done = f"removed {path} (it did not exist before setup)"
        else:
            if not write:
                return f"restore {path} byte for byte from its backup"
            _atomic_write(path, original, state["mode"])
            done = f"restored {path} byte for byte"
    elif current is None:
        raise SetupConflict(
            f"{path} was deleted after setup; the original is kept in {state_dir}"
        )
    else:
        try:
            merged = _revert(agent, current.decode("utf-8"), state["edit"])
        except (SetupConflict, UnicodeDecodeError) as exc:
            backup = state_dir / "original" if original is not None else "(none: no file before)"
            raise SetupConflict(
                f"{path} changed since `lore setup {agent}` and lore's change cannot be "
                f"taken out safely: {exc}. Nothing was written. Edit it by hand; the "
                f"original is at {backup}. Then delete {state_dir}."
            ) from exc
        if not write:
            return f"take lore's change out of {path}, keeping your later edits"
        _atomic_write(path, merged.encode("utf-8"), path.stat().st_mode & 0o777)
        done = f"removed lore's change from {path}, keeping your later edits"

    for name in ("original", "state.json"):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    with contextlib.suppress(OSError):
        state_dir.rmdir()
    return done


def status(
    agent: str, data_dir: Path, gateway_url: str, env: Mapping[str, str] | None = None
) -> AgentStatus:
    path = target_path(agent, env)
    current = _read(path)
    points = False
    if current is not None:
        with contextlib.suppress(UnicodeDecodeError):
            points = _points_at(agent, current.decode("utf-8"), gateway_url)
    return AgentStatus(
        agent=agent,
        path=path,
        exists=current is not None,
        set_up_by_lore=(_state_dir(data_dir, agent) / "state.json").exists(),
        points_at_gateway=points,
    )
