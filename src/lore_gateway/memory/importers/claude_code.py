"""Claude Code transcripts: ``~/.claude/projects/<slug>/<session>.jsonl``.

Each line is one event: ``{"type": "user"|"assistant"|"summary"|..., "sessionId",
"cwd", "timestamp", "uuid", "message": {"role", "content"}}``. An assistant reply
is written as several lines (one per content block); tool results come back as
``user`` lines holding ``tool_result`` blocks. A turn starts at each user line with
the user's own words. Side-chain lines (sub-agent traffic) and ``isMeta`` lines
(command caveats) are not the conversation and are skipped.
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
from lore_gateway.protocols.common import Message

SOURCE = "claude-code"


def default_root() -> Path:
    return Path.home() / ".claude" / "projects"


def find_files(root: Path) -> list[Path]:
    """Transcripts under ``root``: ``projects/*/*.jsonl``, or one project's ``*.jsonl``."""
    if root.is_file():
        return [root]
    return sorted({*root.glob("*.jsonl"), *root.glob("*/*.jsonl")})


def is_transcript(path: Path) -> bool:
    """Whether ``path`` holds Claude Code transcript events (turns or not)."""
    return recognised(path, lambda event: event.get("type") in ("user", "assistant", "summary")
                      and ("message" in event or "summary" in event))


def parse(path: Path, tenant: str) -> Iterator[TurnRecord]:
    session = path.stem
    project = UNKNOWN_PROJECT
    model: str | None = None
    tool_names: dict[str, str] = {}
    first_line = 0
    created_at = path.stat().st_mtime
    messages: list[Message] = []

    def finish() -> Iterator[TurnRecord]:
        if messages:
            yield TurnRecord(
                identity=Identity(tenant=tenant, project=project, session=session),
                protocol=f"import:{SOURCE}", model=model, messages=tuple(messages),
                created_at=created_at,
                dedup_key=dedup_key(SOURCE, session, first_line, messages),
            )

    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (not isinstance(event, dict) or event.get("type") not in ("user", "assistant")
                    or event.get("isSidechain") or event.get("isMeta")
                    or not isinstance(event.get("message"), dict)):
                continue
            session = str(event.get("sessionId") or session)
            project = str(event.get("cwd") or project)
            message = event["message"]
            if event["type"] == "assistant":
                model = message.get("model") if isinstance(message.get("model"), str) else model
                new = _assistant_messages(message.get("content"), tool_names)
            else:
                new = _user_messages(message.get("content"), tool_names)
            if not new:
                continue
            if new[0].role == "user" or not messages:
                yield from finish()
                messages = []
                first_line = number
                created_at = parse_timestamp(event.get("timestamp"), created_at)
            messages.extend(new)
    yield from finish()


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _user_messages(content: Any, tool_names: dict[str, str]) -> list[Message]:
    texts: list[str] = []
    results: list[Message] = []
    for block in _blocks(content):
        if block.get("type") == "text":
            text = str(block.get("text", "")).strip()
            if text and not is_boilerplate(text):
                texts.append(text)
        elif block.get("type") == "tool_result":
            call = str(block.get("tool_use_id"))
            output = render_tool_output(block.get("content", ""))
            results.append(Message("tool", f"[tool:{tool_names.get(call, call)}] {output}"))
    words = [Message("user", "\n".join(texts))] if texts else []
    return words + results


def _assistant_messages(content: Any, tool_names: dict[str, str]) -> list[Message]:
    out: list[Message] = []
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text" and str(block.get("text", "")).strip():
            out.append(Message("assistant", str(block["text"]).strip()))
        elif kind == "thinking" and str(block.get("thinking", "")).strip():
            out.append(Message("assistant", f"[reasoning] {str(block['thinking']).strip()}"))
        elif kind == "tool_use":
            name = str(block.get("name") or "tool")
            tool_names[str(block.get("id"))] = name
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            out.append(Message("assistant", f"[tool_call:{name}] {arguments}"))
    return out
