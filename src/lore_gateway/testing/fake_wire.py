"""What the fake provider's requests and answers look like on the wire.

Pure helpers of ``fake_upstream``, apart from its server: request bodies
decoded (zstd, gzip), the tool output a conversation ends with, the provider
error bodies and reply headers, the ChatGPT backend's static payloads, replayed
fixtures' exact bytes, and generated text streams (big ones never held in
memory, and the benchmark's text of a given number of events).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard

from lore_gateway.testing import fake_streams as fs

# Text per delta in big-stream: large enough that 50 MiB is ~12k frames.
BIG_DELTA_BYTES = 4096


def decode_body(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    if encoding == "gzip":
        return gzip.decompress(raw)
    return raw


def text_of(content: Any) -> str:
    """Text of a tool output: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def tool_output(api: str, body: Any) -> str | None:
    """The tool result the request's conversation ends with, if it ends with one.

    ``api`` is ``responses``, ``chat`` or ``anthropic``. Only the last item
    counts: a new user message after an old tool result starts a new turn.
    """
    if not isinstance(body, dict):
        return None
    items = body.get({"responses": "input"}.get(api, "messages"))
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    last = items[-1]
    if api == "anthropic":
        if last.get("role") != "user" or not isinstance(last.get("content"), list):
            return None
        results = [
            b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        return text_of(results[-1].get("content")) if results else None
    if last.get("type") == "function_call_output":
        return text_of(last.get("output"))
    if last.get("role") == "tool":
        return text_of(last.get("content"))
    return None


# The ids the fake gives tool calls and output items (``fake_streams._id``): a
# prefix and 20 hex digits derived from the content.
_ITEM_ID = re.compile(rb'"((?:toolu_|fc_|call_|msg_)[0-9a-f]{20})"')


def fresh_ids(answer: fs.Answer, request: bytes) -> fs.Answer:
    """``answer`` with every id the request already holds replaced by a new one.

    The fake derives ids from content, so a conversation that gets the same call
    (or the same text) twice would repeat one; a real provider never does, and
    strict mode refuses repeated tool_use and item ids. The new id is the old
    one's first free successor, so equal histories still get equal answers.
    """
    taken = {found for found in set(_ITEM_ID.findall(answer.body)) if found in request}
    if not taken:
        return answer
    swaps = {old: _successor(old, request) for old in taken}

    def swap(data: bytes) -> bytes:
        for old, new in swaps.items():
            data = data.replace(old, new)
        return data

    return fs.Answer(tuple(swap(frame) for frame in answer.frames), swap(answer.body))


def _successor(old: bytes, request: bytes) -> bytes:
    prefix = old.split(b"_", 1)[0] + b"_"
    for n in itertools.count(1):
        new = prefix + hashlib.sha1(old + b"#%d" % n).hexdigest()[:20].encode()
        if new not in request:
            return new
    raise AssertionError("unreachable")


def recall_answer_text(output: str) -> str:
    """What the fake model says after recall: it quotes the top result line of
    the output (``- (role, age) text (ref)``), else the output's first line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    hits = [line for line in lines if line.startswith("- (")]
    quoted = hits[0] if hits else lines[0] if lines else ""
    return f"According to memory: {quoted}"


def model_of(body: Any, default: str) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else default


def error_body(shape: str, status: int, message: str) -> bytes:
    if shape == "anthropic":
        kind = "rate_limit_error" if status == 429 else "api_error"
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    code = "rate_limit_exceeded" if status == 429 else f"fake_{status}"
    return orjson.dumps(
        {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    )


def reply_headers(shape: str, request_id: str) -> dict[str, str]:
    """Headers a real provider attaches and the gateway must relay unchanged."""
    if shape == "anthropic":
        return {
            "request-id": request_id,
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
        }
    headers = {
        "x-request-id": request_id,
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "openai-processing-ms": "1",
    }
    if shape == "codex":
        headers |= {
            "x-codex-primary-used-percent": "12.5",
            "x-codex-primary-window-minutes": "300",
            "x-codex-secondary-used-percent": "3.0",
            "x-codex-secondary-window-minutes": "10080",
        }
    return headers


def jsonl_frames(data: bytes) -> Iterator[bytes]:
    """``.chunks.jsonl``: one data object per line → ``event: <type>`` + ``data: <line>``."""
    for line in data.splitlines():
        line = line.strip()
        if line:
            kind = orjson.loads(line).get("type", "message")
            yield b"event: " + str(kind).encode() + b"\ndata: " + line + b"\n\n"


def replay_bytes(path: Path) -> bytes:
    """Exactly the bytes the fake sends when replaying ``path`` (for assertions)."""
    data = path.read_bytes()
    return b"".join(jsonl_frames(data)) if path.name.endswith(".chunks.jsonl") else data


def big_stream(shape: str, model: str, total: int,
                delta_bytes: int = BIG_DELTA_BYTES) -> Iterator[bytes]:
    """A text answer of about ``total`` bytes in ``delta_bytes`` deltas, never held
    in memory. A two-delta answer is built once; its first delta frame is then
    repeated.
    """
    chunk = "x" * (delta_bytes - 1) + " "
    if shape == "chat":
        frames = fs.chat_text(chunk * 2, model, False, deltas=2).frames
        head, delta, tail = frames[:1], frames[1], frames[2:]
    elif shape == "anthropic":
        frames = fs.anthropic_text(chunk * 2, model, deltas=2).frames
        head, delta, tail = frames[:4], frames[4], frames[5:]
    else:
        frames = fs.responses_text(chunk * 2, model, 2).frames
        head, delta, tail = frames[:5], frames[5], frames[6:]
    yield from head
    for _ in range(max(1, total // delta_bytes - 1)):
        yield delta
    yield from tail


ACCOUNTS = {
    "accounts": [{
        "id": "acct-fake-1234",
        "workspace_backend_origin": "NO_CONSTRAINT",
        "account_routing_override": "NO_CONSTRAINT",
    }],
    "account_ordering": ["acct-fake-1234"],
}
USAGE = {
    "plan_type": "plus",
    "rate_limit": {
        "allowed": True,
        "limit_reached": False,
        "primary_window": {"used_percent": 12, "limit_window_seconds": 18000,
                           "reset_after_seconds": 3600, "reset_at": fs.CREATED_AT + 3600},
        "secondary_window": {"used_percent": 3, "limit_window_seconds": 604800,
                             "reset_after_seconds": 86400, "reset_at": fs.CREATED_AT + 86400},
    },
    "credits": None,
}


def bench_text(events: int) -> str:
    """Text whose Responses stream has exactly ``events`` frames (8 fixed + deltas)."""
    return " ".join(f"tok{i}" for i in range(max(1, events - 8)))
