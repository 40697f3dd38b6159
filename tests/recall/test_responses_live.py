"""The live Responses recall interceptor, fed bytes directly (sans-IO)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from lore_gateway.protocols.responses import ResponsesAccumulator
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.responses.live import (
    Action,
    Done,
    FollowUp,
    Limits,
    LiveInterceptor,
    RunRecall,
    Send,
)
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import fake_streams as fs

FIXTURES = Path("/work/shared/fixtures")
ANCHOR = "0b6c5d0e-8a4f-4c1e-9d2a-3f4b5c6d7e8f"
MODEL = "gpt-fake"


def _events(data: bytes) -> list[Any]:
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


def _client_events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, orjson.loads(e.data)) for e in _events(data) if e.has_data]


def _recall_stream(query: str = "deploy target", text_before: str | None = None) -> bytes:
    frames = b"".join(
        fs.responses_call("recall", orjson.dumps({"query": query}).decode(), MODEL).frames
    )
    if text_before is None:
        return frames
    # Prepend a visible message item at index 0 and shift the call to index 1.
    events = _client_events(frames)
    text = _client_events(b"".join(fs.responses_text(text_before, MODEL).frames))
    items = [
        (n, p)
        for n, p in text
        if n.startswith("response.output") or n.startswith("response.content_part")
    ]
    out = [events[0], *([events[1]] if events[1][0] == "response.in_progress" else [])]
    out += items
    for name, payload in events[len(out) - len(items) :]:
        if "output_index" in payload:
            payload = {**payload, "output_index": payload["output_index"] + 1}
        out.append((name, payload))
    return b"".join(fs.named_frame(n, p) for n, p in out)


def _interceptor(**kw: Any) -> LiveInterceptor:
    return LiveInterceptor(budget=RecallChainBudget(), **kw)


def _run_chain(
    icpt: LiveInterceptor, principal: bytes, continuation: bytes
) -> tuple[bytes, list[Action]]:
    actions = _feed_all(icpt, principal)
    sent = _sent(actions)
    run = [a for a in actions if isinstance(a, RunRecall)]
    assert len(run) == 1
    actions = icpt.recall_done("## Recall Results\nblue cluster", ANCHOR)
    follow = [a for a in actions if isinstance(a, FollowUp)]
    assert follow and not _sent(actions)
    icpt.begin_continuation()
    tail = _feed_all(icpt, continuation)
    return sent + _sent(tail), [*actions, *tail]


def test_no_recall_stream_passes_through_byte_identical() -> None:
    for path in [FIXTURES / "openai-responses/function_call_single_get_weather.chunks.jsonl"]:
        lines = [orjson.loads(x) for x in path.read_text().splitlines() if x.strip()]
        stream = b"".join(fs.named_frame(p["type"], p) for p in lines)
        actions = _feed_all(_interceptor(), stream)
        assert _sent(actions) == stream
        assert actions[-1] == Done(ok=True)
    text = b"".join(fs.responses_text("hello", MODEL).frames)
    assert _sent(_feed_all(_interceptor(), text)) == text


def test_rate_limits_before_created_move_just_after_it_byte_identical() -> None:
    path = FIXTURES / "codex/served-streams/text_with_codex_rate_limits_first_accepted.sse"
    raw = path.read_bytes()
    frames = [e.raw for e in _events(raw)]
    assert b"codex.rate_limits" in frames[0]
    out = _sent(_feed_all(_interceptor(codex=True), raw))
    assert out == frames[1] + frames[0] + b"".join(frames[2:])


def test_recall_is_hidden_and_continuation_spliced_with_principal_id() -> None:
    icpt = _interceptor()
    principal = _recall_stream()
    continuation = b"".join(fs.responses_text("The deploy target is blue.", MODEL).frames)
    client, actions = _run_chain(icpt, principal, continuation)
    events = _client_events(client)
    names = [n for n, _ in events]
    assert b"recall" not in client.replace(b"lore-recall", b"")
    assert names.count("response.created") == 1
    assert names[-1] == "response.completed" and names.count("response.completed") == 1
    assert "response.function_call_arguments.delta" not in names
    principal_id = events[0][1]["response"]["id"]
    assert all(p["response"]["id"] == principal_id for n, p in events if "response" in p)
    seqs = [p["sequence_number"] for _, p in events if "sequence_number" in p]
    assert seqs == list(range(len(seqs)))
    indices = sorted({p["output_index"] for _, p in events if "output_index" in p})
    assert indices == [0, 1]
    terminal = events[-1][1]["response"]
    assert [i["type"] for i in terminal["output"]] == ["message", "message"]
    assert terminal["output"][0]["content"][0]["text"] == f"<!-- lore-recall:{ANCHOR} -->"
    assert terminal["output"][1]["content"][0]["text"] == "The deploy target is blue."
    assert terminal["usage"]["output_tokens"] > 0
    assert actions[-1] == Done(ok=True)
    assert icpt.recall_ran and icpt.depth == 1


def test_follow_up_items_carry_call_and_output() -> None:
    icpt = _interceptor()
    actions = _feed_all(icpt, _recall_stream(text_before="Let me check."))
    run = next(a for a in actions if isinstance(a, RunRecall))
    assert run.args is not None and run.args.query == "deploy target"
    follow = icpt.recall_done("result text", ANCHOR)[0]
    assert isinstance(follow, FollowUp)
    kinds = [i["type"] for i in follow.items]
    assert kinds == ["message", "function_call", "function_call_output"]
    assert follow.items[1]["call_id"] == run.call_id == follow.items[2]["call_id"]
    assert follow.items[2]["output"] == "result text"


def test_text_before_recall_streams_live_and_indices_stay_contiguous() -> None:
    icpt = _interceptor()
    principal = _recall_stream(text_before="Let me check.")
    actions = _feed_all(icpt, principal)
    live = _client_events(_sent(actions))
    assert any(n == "response.output_text.delta" for n, _ in live)  # before recall: live
    icpt.recall_done("r", ANCHOR)
    icpt.begin_continuation()
    tail = _client_events(
        _sent(_feed_all(icpt, b"".join(fs.responses_text("Answer.", MODEL).frames)))
    )
    indices = [p["output_index"] for _, p in live + tail if "output_index" in p]
    assert sorted(set(indices)) == [0, 1, 2]
    assert [i["content"][0]["text"] for i in tail[-1][1]["response"]["output"]] == [
        "Let me check.",
        f"<!-- lore-recall:{ANCHOR} -->",
        "Answer.",
    ]


def test_turn_items_include_hidden_recall_and_its_result() -> None:
    icpt = _interceptor()
    _run_chain(icpt, _recall_stream(), b"".join(fs.responses_text("Done.", MODEL).frames))
    items = icpt.turn_items()
    kinds = [i["type"] for i in items]
    assert kinds == ["function_call", "function_call_output", "message"]
    assert items[0]["name"] == "recall"


def test_mixed_recall_and_visible_tool_has_no_follow_up() -> None:
    icpt = _interceptor()
    recall = _client_events(_recall_stream())
    tool = _client_events(b"".join(fs.responses_call("exec", '{"cmd":"ls"}', MODEL).frames))
    body = [p for p in recall if p[0] not in ("response.completed",)]
    body += [
        (n, {**p, "output_index": 1})
        for n, p in tool
        if n.startswith("response.output_item") or "arguments" in n
    ]
    body.append(recall[-1])
    actions = _feed_all(icpt, b"".join(fs.named_frame(n, p) for n, p in body))
    assert any(isinstance(a, RunRecall) for a in actions)
    after = icpt.recall_done("r", ANCHOR)
    assert not any(isinstance(a, FollowUp) for a in after)
    out = _client_events(_sent(actions) + _sent(after))
    terminal = out[-1][1]["response"]
    assert [i["type"] for i in terminal["output"]] == ["message", "function_call"]
    assert terminal["output"][1]["name"] == "exec"
    assert after[-1] == Done(ok=True)


def test_parallel_recalls_fail_without_running_recall() -> None:
    icpt = _interceptor()
    one = _client_events(_recall_stream())
    body = [p for p in one if p[0] != "response.completed"]
    body += [
        (
            n,
            {
                **p,
                "output_index": 1,
                **(
                    {"item": {**p["item"], "id": "fc_2", "call_id": "call_2"}}
                    if "item" in p
                    else {}
                ),
            },
        )
        for n, p in one
        if n.startswith("response.output_item")
    ]
    body.append(one[-1])
    actions = _feed_all(icpt, b"".join(fs.named_frame(n, p) for n, p in body))
    assert not any(isinstance(a, RunRecall) for a in actions)
    out = _client_events(_sent(actions))
    assert out[-1][0] == "response.failed"
    assert out[-1][1]["response"]["error"]["message"] == (
        "Lore could not continue the response after recall"
    )
    assert actions[-1] == Done(ok=False, category="parallel_recall")


def test_failed_continuation_gets_one_recovery_then_fails() -> None:
    icpt = _interceptor()
    _feed_all(icpt, _recall_stream())
    icpt.recall_done("r", ANCHOR)
    icpt.begin_continuation()
    failed = b"".join(fs.responses_failed(MODEL).frames)
    actions = _feed_all(icpt, failed)
    assert actions == [FollowUp(items=actions[0].items, recovery=True)]  # type: ignore[union-attr]
    icpt.begin_continuation(recovery=True)
    final = _feed_all(icpt, failed)
    out = _client_events(_sent(final))
    assert [n for n, _ in out] == ["response.failed"]
    assert b"lore-recall" not in _sent(final)
    assert final[-1] == Done(ok=False, category="follow_up_failed")


def test_recovery_success_delivers_marker_and_answer() -> None:
    icpt = _interceptor()
    _feed_all(icpt, _recall_stream())
    icpt.recall_done("r", ANCHOR)
    icpt.begin_continuation()
    _feed_all(icpt, b"".join(fs.responses_failed(MODEL).frames))
    icpt.begin_continuation(recovery=True)
    final = _feed_all(icpt, b"".join(fs.responses_text("Recovered.", MODEL).frames))
    out = _client_events(_sent(final))
    assert out[-1][0] == "response.completed"
    texts = [i["content"][0]["text"] for i in out[-1][1]["response"]["output"]]
    assert texts == [f"<!-- lore-recall:{ANCHOR} -->", "Recovered."]


def test_invalid_arguments_become_a_tool_result_without_marker() -> None:
    icpt = _interceptor()
    actions = _feed_all(icpt, _recall_stream(query="x" * 600))
    run = next(a for a in actions if isinstance(a, RunRecall))
    assert run.args is None and run.invalid is not None
    follow = icpt.recall_done("", None)[0]
    assert isinstance(follow, FollowUp)
    assert follow.items[-1]["output"].startswith("Invalid recall arguments (query_length).")
    icpt.begin_continuation()
    out = _sent(_feed_all(icpt, b"".join(fs.responses_text("ok", MODEL).frames)))
    assert b"lore-recall" not in out


def test_malformed_json_and_type_mismatch_fail_the_stream() -> None:
    created = fs.responses_text("x", MODEL).frames[0]
    for bad, reason in (
        (b"event: response.output_text.delta\ndata: {nope\n\n",
         "malformed JSON in Responses event response.output_text.delta"),
        (b'event: response.output_text.delta\ndata: {"type":"response.other"}\n\n',
         "Responses payload type does not match response.output_text.delta"),
    ):
        icpt = _interceptor()
        out = _client_events(_sent(_feed_all(icpt, created + bad)))
        assert out[-1][0] == "response.failed"
        # The spec's words, then why (the upstream's fault, so the client is told).
        assert out[-1][1]["response"]["error"]["message"] == f"Gateway request failed: {reason}"
    icpt = _interceptor()
    _feed_all(icpt, created + b"event: response.output_text.delta\ndata: {nope\n\n")
    assert icpt.failure == (
        "principal_protocol",
        "malformed JSON in Responses event response.output_text.delta",
    )


def test_deferred_limit_and_stream_limit() -> None:
    icpt = _interceptor(limits=Limits(deferred_bytes=200))
    out = _client_events(_sent(_feed_all(icpt, _recall_stream())))
    assert out[-1][0] == "response.failed"
    assert icpt.failure is not None and icpt.failure[1] == (
        "recall stream exceeded deferred event limit"
    )
    icpt = _interceptor(limits=Limits(stream_bytes=300))
    _feed_all(icpt, b"".join(fs.responses_text("hello", MODEL).frames))
    assert icpt.failure is not None and icpt.failure[1] == "Responses stream exceeded byte limit"


def test_done_and_empty_data_are_ignored_and_unknown_events_forwarded() -> None:
    frames = list(fs.responses_text("hi", MODEL).frames)
    extra = b"data: [DONE]\n\ndata: \n\nevent: vendor.note\ndata: not json\n\n"
    stream = frames[0] + extra + b"".join(frames[1:])
    out = _sent(_feed_all(_interceptor(), stream))
    assert b"[DONE]" not in out and b"event: vendor.note\ndata: not json\n\n" in out


# --- item state is ResponsesAccumulator's (shared with storage) ------------------------

SPARSE_RESPONSE = {"id": "resp_c", "object": "response", "model": MODEL,
                   "status": "in_progress", "output": []}


def _frames(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(fs.named_frame(name, {"type": name, **payload}) for name, payload in events)


def _sparse_codex_answer(text: str) -> bytes:
    """A Codex-backend answer: no output indices, the message never added, and a
    done item without content (its text only in the deltas)."""
    half = len(text) // 2
    done = {"type": "message", "id": "msg_c", "role": "assistant", "status": "completed"}
    return _frames(
        ("response.created", {"response": SPARSE_RESPONSE}),
        ("response.output_text.delta", {"item_id": "msg_c", "delta": text[:half]}),
        ("response.output_text.annotation.added",
         {"item_id": "msg_c", "annotation": {"type": "url_citation", "url": "https://x.test"}}),
        ("response.output_text.delta", {"item_id": "msg_c", "delta": text[half:]}),
        ("response.output_item.done", {"item": done}),
        ("response.completed",
         {"response": {**SPARSE_RESPONSE, "status": "completed", "output": []}}),
    )


def _texts(items: list[dict[str, Any]]) -> list[str]:
    return [part["text"] for item in items if item.get("type") == "message"
            for part in item.get("content") or [] if part.get("type") == "output_text"]


def test_sparse_codex_continuation_is_stored_as_the_accumulator_builds_it() -> None:
    answer = "The deploy target is blue."
    icpt = _interceptor(codex=True)
    _feed_all(icpt, _recall_stream())
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


def _by_read(icpt: LiveInterceptor, data: bytes, read: int, *, batched: bool) -> list[Action]:
    """The stream in reads of ``read`` bytes, each read's events fed at once
    (``feed_all``, as the handler does) or one by one (``feed``)."""
    dec = SSEDecoder()
    out: list[Action] = []
    for start in range(0, len(data), read):
        events = dec.feed(data[start:start + read])
        out.extend(icpt.feed_all(events) if batched else
                   [a for ev in events for a in icpt.feed(ev)])
    out.extend(icpt.end_of_stream())
    return out


def test_a_read_fed_at_once_gives_the_client_the_same_bytes_and_actions() -> None:
    text = b"".join(fs.responses_text("hello there, a longer answer " * 4, MODEL).frames)
    frames = [e.raw for e in _events(text)]
    delta = next(i for i, f in enumerate(frames) if b"output_text.delta" in f)
    malformed = b"".join([*frames[:delta + 1],
                          b"event: response.output_text.delta\ndata: {\"type\":\n\n",
                          *frames[delta + 1:]])
    mismatched = b"".join([*frames[:delta + 1],
                           b"event: response.output_text.delta\n"
                           b"data: {\"type\":\"response.refusal.delta\",\"delta\":\"x\"}\n\n",
                           *frames[delta + 1:]])
    for stream in (text, malformed, mismatched, _recall_stream(text_before="before")):
        for read in (7, 100, len(stream)):
            one = _by_read(_interceptor(), stream, read, batched=False)
            batched = _by_read(_interceptor(), stream, read, batched=True)
            assert _sent(batched) == _sent(one)
            assert ([a for a in batched if not isinstance(a, Send)]
                    == [a for a in one if not isinstance(a, Send)])
    assert _sent(_by_read(_interceptor(), text, 100, batched=True)) == text


def test_a_mixed_continuation_still_sends_the_first_recalls_marker() -> None:
    """A chain whose continuation is mixed (a second recall beside a visible tool)
    ends without a follow-up; the first recall's marker, spooled until the chain
    ended, reaches the client with the second's, and every item the terminal lists
    was sent before it."""
    icpt = _interceptor()
    sent = _sent(_feed_all(icpt, _recall_stream()))
    icpt.recall_done("## Recall Results\nblue cluster", ANCHOR)
    icpt.begin_continuation()
    recall = _client_events(_recall_stream("deploy region"))
    tool = _client_events(b"".join(fs.responses_call("exec", '{"cmd":"ls"}', MODEL).frames))
    body = [p for p in recall if p[0] != "response.completed"]
    body += [(n, {**p, "output_index": 1}) for n, p in tool
             if n.startswith("response.output_item") or "arguments" in n]
    body.append(recall[-1])
    actions = _feed_all(icpt, b"".join(fs.named_frame(n, p) for n, p in body))
    assert any(isinstance(a, RunRecall) for a in actions)
    after = icpt.recall_done("## Recall Results\nwest", ANCHOR)
    assert not any(isinstance(a, FollowUp) for a in after) and after[-1] == Done(ok=True)
    events = _client_events(sent + _sent(actions) + _sent(after))
    done_ids = [p["item"]["id"] for n, p in events if n == "response.output_item.done"]
    terminal = events[-1][1]["response"]["output"]
    assert [i["id"] for i in terminal] == done_ids
    assert [i["type"] for i in terminal] == ["message", "message", "function_call"]
    assert terminal[2]["name"] == "exec"
