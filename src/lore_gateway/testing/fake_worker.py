"""The fake provider playing the worker model (requests with ``x-lore-worker``).

Deterministic stand-ins for what a real model would write, derived from the
request itself, so tests can check what reached the store:

- ``distill``: one 🔴 observation per user line of the segment, one 🟡 per
  assistant line that states a decision;
- ``curate``: one knowledge entry per 🔴 observation that states a decision
  (``Decision: <title>. <details>``) or a preference (``always`` / ``never`` /
  ``prefer``); the title is the text before the first period;
- ``consolidate``: every distinct bullet of the logs, under the first date.

Like a real model, an answer stops at the request's output cap.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

CHARS_PER_TOKEN = 4
_LINE_RE = re.compile(
    r"^\[(\d\d:\d\d)\] (user|assistant|tool): (.*?)(?=^\[\d\d:\d\d\] |</segment>|\Z)",
    re.M | re.S)
_DATE_RE = re.compile(r'<segment date="([^"]+)">')
_RED_RE = re.compile(r"^\* 🔴 \((\d\d:\d\d)\) (?:User: )?(.+)$", re.M)
_DECISION_RE = re.compile(r"\b(decid\w*|decision)\b", re.I)
_PREFERENCE_RE = re.compile(r"\b(always|never|prefer\w*)\b", re.I)


def prompt_text(body: dict[str, Any]) -> str:
    """The user text of a worker request, in any of the five shapes."""
    items = next((body[k] for k in ("messages", "input", "contents") if k in body), None)
    texts: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        content = item.get("content", item.get("parts"))  # Gemini: parts
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(texts)


def answer(job: str, body: dict[str, Any]) -> str:
    """The scripted answer, cut at the request's output cap as a real model's is
    (``max_tokens`` / ``max_output_tokens`` / ``maxOutputTokens``; 4 characters a token, the strict
    provider's estimate): a log longer than its budget ends mid-line."""
    text = prompt_text(body)
    if job == "distill":
        out = _observations(text)
    elif job == "curate":
        return _curate(text)  # JSON: the worker's own cap is far above it
    elif job == "consolidate":
        out = _consolidate(text)
    else:
        out = "ok"
    config = body.get("generationConfig")
    gemini_cap = config.get("maxOutputTokens") if isinstance(config, dict) else None
    cap = body.get("max_tokens", body.get("max_output_tokens", gemini_cap))
    return out[: int(cap) * CHARS_PER_TOKEN] if isinstance(cap, int) else out


def _consolidate(text: str) -> str:
    """The logs' bullets once each, under the first date line."""
    date = re.search(r"^Date: .+$", text, re.M)
    seen: dict[str, None] = {}
    for line in re.findall(r"^\* (?:🔴|🟡|🟢) \(\d\d:\d\d\) .+$", text, re.M):
        seen.setdefault(line, None)
    head = date.group(0) if date else "Date: Jan 1, 2026"
    return "<observations>\n" + "\n".join([head, *seen]) + "\n</observations>"


def _observations(text: str) -> str:
    date = _DATE_RE.search(text)
    lines = [f"Date: {date.group(1) if date else 'Jan 1, 2026'}"]
    for at, role, said in _LINE_RE.findall(text):
        if role == "user":
            lines += [f"* 🔴 ({at}) User: {' '.join(line.split())}"
                      for line in said.splitlines() if line.strip()]
        elif role == "assistant" and _DECISION_RE.search(said):
            lines.append(f"* 🟡 ({at}) {' '.join(said.split())}")
    return "<observations>\n" + "\n".join(lines) + "\n</observations>"


def _curate(text: str) -> str:
    logs = text.split("New session logs:", 1)[-1]
    ops: list[dict[str, Any]] = []
    for _at, said in _RED_RE.findall(logs):
        said = said.strip()
        if _DECISION_RE.search(said):
            category = "decision"
            said = re.sub(r"^.*?\bDecision:\s*", "", said, flags=re.I)
        elif _PREFERENCE_RE.search(said):
            category = "preference"
        else:
            continue
        title = said.split(".", 1)[0].strip()[:80]
        ops.append({"op": "create", "category": category, "title": title, "content": said,
                    "confidence": 0.9, "cross_project": False})
    return orjson.dumps({"ops": ops}).decode()
