"""Codex CLI rollout files: ``~/.codex/sessions/**/rollout-*.jsonl``.

Each line is ``{"timestamp", "type", "payload"}``. ``session_meta`` carries the
session id (the same value Codex sends live as ``session-id``, so imported and
proxied turns land in one session) and the cwd; ``turn_context`` the model and cwd;
``response_item`` the Responses items themselves. ``event_msg`` lines repeat what
the items say for the UI and are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lore_gateway.memory.importers import (
    dedup_key,
    is_boilerplate,
    parse_timestamp,
    recognised,
    render_tool_output,
)
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.tenancy.identity import UNKNOWN_PROJECT
from lore_gateway.protocols.common import Message, content_text

SOURCE = "codex"


def default_root() -> Path:
    return Path.home() / ".codex" / "sessions"


def find_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(root.rglob("rollout-*.jsonl"))


def is_transcript(path: Path) -> bool:
    """Whether ``path`` holds Codex rollout records (turns or not)."""
    return recognised(path, lambda record: isinstance(record.get("payload"), dict)
                      and record.get("type") in ("session_meta", "turn_context",
                                                 "response_item", "event_msg"))


class _Turn:
    def __init__(self, first_line: int, created_at: float) -> None:
        self.first_line = first_line
        self.created_at = created_at
        self.messages: list[Message] = []


def parse(path: Path, tenant: str) -> Iterator[TurnRecord]:
    session = path.stem
    project = UNKNOWN_PROJECT
    model: str | None = None
    tool_names: dict[str, str] = {}
    current: _Turn | None = None
    fallback_time = path.stat().st_mtime

    def finish(turn: _Turn | None) -> Iterator[TurnRecord]:
        if turn is None or not turn.messages:
            return
        yield TurnRecord(
            identity=Identity(tenant=tenant, project=project, session=session),
            protocol=f"import:{SOURCE}", model=model, messages=tuple(turn.messages),
            created_at=turn.created_at,
            dedup_key=dedup_key(SOURCE, session, turn.first_line, turn.messages),
        )

    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("payload"), dict):
                continue
            kind, payload = record.get("type"), record["payload"]
            when = parse_timestamp(record.get("timestamp"), fallback_time)
            if kind == "session_meta":
                session = str(payload.get("id") or session)
                project = str(payload.get("cwd") or project)
            elif kind == "turn_context":
                model = payload.get("model") if isinstance(payload.get("model"), str) else model
                project = str(payload.get("cwd") or project)
            elif kind == "response_item":
                role, text = _item_message(payload, tool_names)
                if text is None:
                    continue
                if role == "user" or current is None:
                    yield from finish(current)
                    current = _Turn(number, when)
                current.messages.append(Message(role, text))
    yield from finish(current)


def _item_message(item: dict[str, Any], tool_names: dict[str, str]) -> tuple[Any, str | None]:
    """(role, text) of one Responses item, or (_, None) for items not worth storing."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        text = content_text(item.get("content")).strip()
        if role not in ("user", "assistant") or not text or is_boilerplate(text):
            return role, None
        return role, text
    if kind in ("function_call", "custom_tool_call"):
        name = str(item.get("name") or "tool")
        tool_names[str(item.get("call_id"))] = name
        arguments = item.get("arguments", item.get("input", ""))
        return "assistant", f"[tool_call:{name}] {render_tool_output(arguments)}"
    if kind == "local_shell_call":
        action = item.get("action") or {}
        command = action.get("command") if isinstance(action, dict) else None
        shown = " ".join(command) if isinstance(command, list) else json.dumps(action)
        tool_names[str(item.get("call_id"))] = "shell"
        return "assistant", f"[tool_call:shell] {shown}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        name = tool_names.get(str(item.get("call_id")), str(item.get("call_id")))
        return "tool", f"[tool:{name}] {render_tool_output(item.get('output', ''))}"
    if kind == "reasoning":
        summary = item.get("summary")
        parts = [p.get("text", "") for p in summary if isinstance(p, dict)] \
            if isinstance(summary, list) else []
        text = "\n".join(p for p in parts if p)
        return "assistant", (f"[reasoning] {text}" if text else None)
    return None, None
