"""The live Responses interceptor keeps its item state in ``ResponsesAccumulator``
(the accumulator storage uses too): sparse Codex streams and events with nothing to
accumulate are handled once, for both (sans-IO)."""

from __future__ import annotations

from typing import Any

import orjson

from lore_gateway.protocols.responses import ResponsesAccumulator
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.responses.live import Action, Done, FollowUp, LiveInterceptor, Send
from lore_gateway.sse import SSEDecoder, SSEEvent
from lore_gateway.testing import fake_streams as fs

MODEL = "gpt-fake"
ANCHOR = "0b6c5d0e-8a4f-4c1e-9d2a-3f4b5c6d7e8f"
RESPONSE = {"id": "resp_c", "object": "response", "model": MODEL, "status": "in_progress",
            "output": []}


def _events(data: bytes) -> list[SSEEvent]:
    dec = SSEDecoder()
    return [*dec.feed(data), *dec.close()]


def _feed_all(icpt: LiveInterceptor, data: bytes) -> list[Action]:
    out: list[Action] = []
    for ev in _events(data):
        out.extend(icpt.feed(ev))
    out.extend(icpt.end_of_stream())
    return out


def _sent(actions: list[Action]) -> bytes:
    return b"".join(a.data for a in actions if isinstance(a, Send))


def _frames(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(fs.named_frame(name, {"type": name, **payload}) for name, payload in events)


def _recall_principal() -> bytes:
    query = orjson.dumps({"query": "deploy target"}).decode()
    return b"".join(fs.responses_call("recall", query, MODEL).frames)


def _sparse_codex_answer(text: str) -> bytes:
    """A Codex-backend answer: no output indices, the message never added, and a
    done item without content (its text only in the deltas)."""
    half = len(text) // 2
    done = {"type": "message", "id": "msg_c", "role": "assistant", "status": "completed"}
    return _frames(
        ("response.created", {"response": RESPONSE}),
        ("response.output_text.delta", {"item_id": "msg_c", "delta": text[:half]}),
        ("response.output_text.annotation.added",
         {"item_id": "msg_c", "annotation": {"type": "url_citation", "url": "https://x.test"}}),
        ("response.output_text.delta", {"item_id": "msg_c", "delta": text[half:]}),
        ("response.output_item.done", {"item": done}),
        ("response.completed", {"response": {**RESPONSE, "status": "completed", "output": []}}),
    )


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [part["text"] for item in items if item.get("type") == "message"
            for part in item.get("content") or [] if part.get("type") == "output_text"]


def test_sparse_codex_continuation_is_stored_as_the_accumulator_builds_it() -> None:
    answer = "The deploy target is blue."
    icpt = LiveInterceptor(budget=RecallChainBudget(), codex=True)
    _feed_all(icpt, _recall_principal())
    follow = icpt.recall_done("## Recall Results\nblue cluster", ANCHOR)
    assert any(isinstance(a, FollowUp) for a in follow)
    icpt.begin_continuation()
    tail = _feed_all(icpt, _sparse_codex_answer(answer))
    assert tail[-1] == Done(ok=True)
    client = _sent(tail)
    assert b"response.output_text.annotation.added" in client  # forwarded, not dropped

    acc = ResponsesAccumulator("codex")
    for ev in _events(_sparse_codex_answer(answer)):
        acc.feed_event(ev)
    stored = icpt.turn_items()
    assert _texts(stored) == _texts(acc.result().output) == [answer]
    assert [i["type"] for i in stored] == ["function_call", "function_call_output", "message"]


def test_public_accumulator_keeps_text_across_an_annotation_event() -> None:
    text = b"".join(fs.responses_text("hi", MODEL).frames)
    frames = [orjson.loads(e.data) for e in _events(text)]
    at = next(i for i, p in enumerate(frames) if p["type"] == "response.output_text.done")
    note = {"type": "response.output_text.annotation.added", "output_index": 0,
            "item_id": frames[at]["item_id"], "content_index": 0, "annotation_index": 0,
            "annotation": {"type": "url_citation", "url": "https://x.test"}}
    acc = ResponsesAccumulator("public")
    for payload in [*frames[:at], note, *frames[at:]]:
        acc.feed_json(payload["type"], payload)
    assert acc.done and acc.result().text == "hi"
