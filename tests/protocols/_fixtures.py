"""Load the recorded streams in ../shared/fixtures as decoded SSE frames."""

from __future__ import annotations

import json
from pathlib import Path

from lore_gateway.sse import SSEDecoder, SSEEvent

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


def stream_bytes(path: Path) -> bytes:
    """Raw bytes of a ``.sse`` file, or a ``.chunks.jsonl`` file wrapped as named events."""
    if path.name.endswith(".jsonl"):
        out = b""
        for line in path.read_text().splitlines():
            if line.strip():
                name = json.loads(line)["type"]
                out += f"event: {name}\ndata: {line}\n\n".encode()
        return out
    return path.read_bytes()


def events(path: Path) -> list[SSEEvent]:
    dec = SSEDecoder()
    return dec.feed(stream_bytes(path)) + dec.close()


def split_at_created(evs: list[SSEEvent]) -> list[list[SSEEvent]]:
    """A file holding several consecutive responses, one list per response."""
    groups: list[list[SSEEvent]] = [[]]
    for ev in evs:
        if ev.event == "response.created" and any(
            e.event == "response.created" for e in groups[-1]
        ):
            groups.append([])
        groups[-1].append(ev)
    return groups


def body_of(rel: str) -> dict:
    return json.loads((FIXTURES / rel).read_text())["body"]
