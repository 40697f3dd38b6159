"""Frames the gateway synthesises on a Responses stream (lore-spec C.5, C.7, D.7).

Pure builders: the interceptor decides *when*; these decide the exact shape, in
the form the openai SDK's strict models accept (every event has ``type`` and
``sequence_number``; text events carry ``logprobs``; parts carry ``annotations``).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from lore_gateway.recall.core.markers import anchor_text
from lore_gateway.sse import encode_event


def marker_item(response_id: str | None, public_index: int, anchor_id: str) -> dict[str, Any]:
    """The anchor as a completed message item at ``public_index``."""
    return {
        "id": f"msg_{response_id or 'lore'}_{public_index}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": anchor_text(anchor_id), "annotations": []}],
    }


def marker_events(item: dict[str, Any], public_index: int, first_seq: int) -> list[bytes]:
    """The six events of a synthetic message item: added, part added, delta, text
    done, part done, item done; sequence numbers from ``first_seq``."""
    text = item["content"][0]["text"]
    part = {"type": "output_text", "text": "", "annotations": []}
    common = {"item_id": item["id"], "output_index": public_index, "content_index": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "response.output_item.added",
            {
                "output_index": public_index,
                "item": {**item, "status": "in_progress", "content": []},
            },
        ),
        ("response.content_part.added", {**common, "part": part}),
        ("response.output_text.delta", {**common, "delta": text, "logprobs": []}),
        ("response.output_text.done", {**common, "text": text, "logprobs": []}),
        ("response.content_part.done", {**common, "part": {**part, "text": text}}),
        ("response.output_item.done", {"output_index": public_index, "item": item}),
    ]
    return [
        encode_event(name, orjson.dumps({"type": name, "sequence_number": first_seq + n, **body}))
        for n, (name, body) in enumerate(events)
    ]


def failed_event(
    *, response_id: str | None, created_at: Any, model: Any, message: str, seq: int
) -> bytes:
    """The one ``response.failed`` a client gets when the gateway cannot finish."""
    response: dict[str, Any] = {
        "id": response_id or "resp_error",
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "model": model or "unknown",
        "status": "failed",
        "output": [],
        "usage": None,
        "error": {"type": "server_error", "code": "server_error", "message": message},
    }
    payload = {"type": "response.failed", "sequence_number": seq, "response": response}
    return encode_event("response.failed", orjson.dumps(payload))
