"""How the fake provider delivers an answer: frame by frame, misbehaving on
demand, or a recorded fixture replayed byte for byte.

``FakeUpstream`` (fake_upstream.py) decides *what* a request gets (routes,
scenarios, strict refusals, metering); this module only writes it to the
socket, so the wire-level tricks (stalls, resets, bent frames, slices that
straddle frames) are in one place and the fake's class stays about requests.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from lore_gateway.testing.fake_scenarios import Scenario
from lore_gateway.testing.fake_streams import Answer
from lore_gateway.testing.fake_wire import error_body, jsonl_frames

# Frames sent before a mid-stream misbehaviour, so the client has started.
MISBEHAVE_AFTER = 3
# How often a stalled handler looks whether its client has gone.
STALL_POLL_S = 0.01
# Replayed .sse files are written in slices of this size, so frames straddle
# chunk boundaries the way they do on a real network.
REPLAY_SLICE_BYTES = 1024

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
JSON_TYPE = "application/json"


@dataclass
class RecordedRequest:
    """One request as the fake received it (body already decompressed)."""

    method: str
    path: str  # path and query string, e.g. "/v1/messages?beta=true"
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_body: bytes  # as received, possibly compressed
    json: Any
    scenario: str = ""
    received_at: float = field(default_factory=time.monotonic)
    client_gone: threading.Event = field(default_factory=threading.Event, repr=False)
    client_gone_at: float | None = None  # time.monotonic() when the client closed
    finished_at: float | None = None  # time.monotonic() when a stream's last byte was sent

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    def mark_client_gone(self) -> None:
        if self.client_gone_at is None:
            self.client_gone_at = time.monotonic()
        self.client_gone.set()


async def misbehave(
    request: web.BaseRequest,
    record: RecordedRequest,
    scenario: Scenario,
    shape: str,
    answer: Answer,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Stream ``answer``, bent as the scenario asks (cut short, a malformed
    event, a reset, a stall) or as it is."""
    frames = answer.frames
    name = scenario.name
    if name in ("missing-terminal", "no-completed"):
        return await stream(request, record, frames[:-1], headers)
    if name == "malformed-event":
        kind = "response.output_text.delta" if shape != "anthropic" else "content_block_delta"
        bad = (b"data: {\"choices\":[{\"delta\":\n\n" if shape == "chat"
               else b"event: " + kind.encode() + b"\ndata: {\"type\":\"" + kind.encode()
               + b"\",\"delta\":\n\n")
        bent = (*frames[:MISBEHAVE_AFTER], bad, *frames[MISBEHAVE_AFTER:])
        return await stream(request, record, bent, headers)
    if name == "reset-mid-stream":
        count = int(scenario.arg or MISBEHAVE_AFTER)
        return await stream(request, record, frames[:count], headers, reset=True)
    if name == "reset-mid-event":
        count = int(scenario.arg or MISBEHAVE_AFTER)
        half = frames[count][: len(frames[count]) // 2]
        return await stream(request, record, (*frames[:count], half), headers, reset=True)
    if name in ("stall", "linger"):
        seconds = float(scenario.arg) if scenario.arg else None
        return await stream(request, record, frames, headers, stall=name == "stall",
                            linger=name == "linger", stall_seconds=seconds)
    return await stream(request, record, frames, headers)


async def stream(
    request: web.BaseRequest,
    record: RecordedRequest,
    frames: Iterable[bytes],
    headers: dict[str, str],
    *,
    reset: bool = False,
    stall: bool = False,
    linger: bool = False,
    stall_seconds: float | None = None,
) -> web.StreamResponse:
    """Write ``frames`` one by one; optionally stall after a few or after the last
    (``linger``: a whole answer whose end of body comes late), or reset the TCP link."""
    response = web.StreamResponse(headers={**SSE_HEADERS, **headers})
    try:
        await response.prepare(request)
        for index, frame in enumerate(frames):
            if stall and index == MISBEHAVE_AFTER:
                await _stall(request, record, stall_seconds)
                if record.client_gone.is_set():
                    return response
            await response.write(frame)
        if linger:
            await _stall(request, record, stall_seconds)
            if record.client_gone.is_set():
                return response
        if reset:
            await asyncio.sleep(0.05)  # let the client read what was sent first
            _reset(request)
            record.mark_client_gone()
            return response
        await response.write_eof()
        record.finished_at = time.monotonic()
    except (ConnectionError, asyncio.CancelledError):
        record.mark_client_gone()
        raise
    return response


async def _stall(request: web.BaseRequest, record: RecordedRequest,
                 seconds: float | None) -> None:
    """Send nothing for ``seconds`` (None: until the client goes away)."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while deadline is None or time.monotonic() < deadline:
        transport = request.transport
        if transport is None or transport.is_closing():
            record.mark_client_gone()
            return
        await asyncio.sleep(STALL_POLL_S)


async def replay(request: web.BaseRequest, record: RecordedRequest, name: str,
                 headers: dict[str, str], fixtures_dir: Path | None) -> web.StreamResponse:
    """A recorded fixture as it was: a ``.json`` body, a ``.chunks.jsonl`` frame
    by frame, anything else in slices (SSE even to a ``stream:false`` request)."""
    path = Path(name)
    if not path.is_absolute() and fixtures_dir is not None:
        path = fixtures_dir / path
    if not path.is_file():
        return web.Response(status=404, body=error_body("responses", 404, f"no fixture {path}"),
                            content_type=JSON_TYPE)
    data = path.read_bytes()
    if path.name.endswith(".json"):
        return web.Response(body=data, content_type=JSON_TYPE, headers=headers)
    if path.name.endswith(".chunks.jsonl"):
        frames: Iterable[bytes] = list(jsonl_frames(data))
    else:
        step = REPLAY_SLICE_BYTES
        frames = [data[i : i + step] for i in range(0, len(data), step)]
    return await stream(request, record, frames, headers)


def _reset(request: web.BaseRequest) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), as a crashed server would."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
