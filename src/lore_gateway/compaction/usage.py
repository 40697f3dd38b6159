"""Usage the client can live with: reported token counts scaled below the agent's
own auto-compaction threshold (sans-IO).

Claude Code and the Codex CLI decide to compact from the usage the last
response reported (wave2-memory §4.1, §4.2). The gateway manages the context
itself, so the client is shown at most a cap under its threshold:

* Claude Code: ``0.9 × (W − min(max_output, 20K) − 13K)``, 150,300 for W = 200K.
  W is the window Claude Code meters against; 200K unless configured, which is
  also safe for a client metering at 1M.
* Codex: ``0.9 × ⌊0.9 × W⌋`` (Codex compacts at 90 % of its window, and only
  ever lower); 220,320 for its 272K fallback window.

Only the bytes that carry usage change, and only when a figure passes the cap:
every field is scaled by the same factor, so the shares (cache reads, output)
stay as the provider reported them. The real figures are what the gateway
stores and meters; the scaled copy goes to the client alone.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from lore_gateway.protocols.history import HistoryAdapter

# Claude Code's reserve for the summary's output and its auto-compact buffer.
CLAUDE_SUMMARY_RESERVE = 20_000
CLAUDE_AUTOCOMPACT_BUFFER = 13_000
# Codex compacts at this share of its window at most (min(configured, 0.9 W)).
CODEX_THRESHOLD_SHARE = 0.9
# The share of the threshold shown at most: headroom for what the agent adds to
# the last reported figure (its estimate of the items sent since).
SAFETY_SHARE = 0.9
# A frame is held only until its end arrives; one larger than this is passed on
# unread (a usage frame is a few hundred bytes, a text delta can be large).
MAX_HELD_BYTES = 1 << 20


class Agent(enum.StrEnum):
    CLAUDE_CODE = "claude-code"
    CODEX = "codex"


def client_agent(headers: dict[str, str] | Any) -> Agent | None:
    """Which compacting agent sent the request (None: an SDK or unknown client)."""
    if headers.get("originator", "").startswith("codex"):
        return Agent.CODEX
    if "x-claude-code-session-id" in headers or headers.get("user-agent", "").startswith(
            "claude-cli/"):
        return Agent.CLAUDE_CODE
    return None


def claude_cap(window: int, max_output: int | None) -> int:
    reserve = min(max_output or CLAUDE_SUMMARY_RESERVE, CLAUDE_SUMMARY_RESERVE)
    return int(SAFETY_SHARE * (window - reserve - CLAUDE_AUTOCOMPACT_BUFFER))


def codex_cap(window: int) -> int:
    return int(SAFETY_SHARE * int(CODEX_THRESHOLD_SHARE * window))


@dataclass(frozen=True, slots=True)
class UsageCap:
    """The most total tokens one response may report to this client."""

    tokens: int
    history: HistoryAdapter  # the protocol's usage shape (``usage_scaler``)

    def factor(self, total: int) -> float | None:
        """The scale for a response whose real total is ``total`` (None: unchanged)."""
        return self.tokens / total if total > self.tokens > 0 else None


# --- the rewriter ----------------------------------------------------------------

_FRAME_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class UsageRewriter:
    """Rewrites usage in one response to the client: SSE chunks or a JSON body.

    Frames are passed on whole; a frame's bytes wait here only until its end
    arrives (a client cannot act on half an event anyway). Frames without
    ``"usage"`` go out as they came.
    """

    __slots__ = ("_held", "_usage", "cap", "scaled")

    def __init__(self, cap: UsageCap) -> None:
        self.cap = cap
        self._held = b""
        self._usage = cap.history.usage_scaler()
        self.scaled = 0  # frames (or bodies) rewritten

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        end = _last_frame_end(data)
        if end < 0:
            if len(data) > MAX_HELD_BYTES:
                self._held = b""
                return data
            self._held = data
            return b""
        ready, self._held = data[:end], data[end:]
        if b'"usage"' not in ready:
            return ready
        return b"".join(self._frame(f) for f in _split_frames(ready))

    def close(self) -> bytes:
        held, self._held = self._held, b""
        return self._frame(held) if held and b'"usage"' in held else held

    def json_body(self, body: bytes) -> bytes:
        """A whole JSON response body."""
        if b'"usage"' not in body:
            return body
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(payload, dict) or not self._scale_holders(payload):
            return body
        self.scaled += 1
        return orjson.dumps(payload)

    def _frame(self, frame: bytes) -> bytes:
        if b'"usage"' not in frame:
            return frame
        start = frame.find(b"data:")
        if start < 0:
            return frame
        line_end = frame.find(b"\n", start)
        data_end = len(frame.rstrip(b"\r\n")) if line_end < 0 else line_end
        raw = frame[start + 5:data_end].strip()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return frame
        if not isinstance(payload, dict) or not self._scale_holders(payload):
            return frame
        self.scaled += 1
        return frame[:start] + b"data: " + orjson.dumps(payload) + frame[data_end:]

    def _scale_holders(self, payload: dict[str, Any]) -> bool:
        changed = False
        kind = payload.get("type")
        for holder in (payload, payload.get("message"), payload.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                changed |= self._usage.scale(holder["usage"], self.cap.factor, kind)
        return changed


def _last_frame_end(data: bytes) -> int:
    """The offset just after the last complete frame in ``data`` (-1: none)."""
    end = -1
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = data.rfind(sep)
        if at >= 0:
            end = max(end, at + len(sep))
    return end


def _split_frames(data: bytes) -> list[bytes]:
    """Complete frames, each with its own terminator."""
    frames: list[bytes] = []
    pos = 0
    for match in _FRAME_END.finditer(data):
        frames.append(data[pos:match.end()])
        pos = match.end()
    if pos < len(data):
        frames.append(data[pos:])
    return frames
