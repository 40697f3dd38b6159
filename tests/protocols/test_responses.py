"""Responses accumulator: every recorded stream, both modes, and the error strings."""

from __future__ import annotations

import json

import pytest

from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.protocols.responses import (
    ResponsesAccumulator,
    new_input_messages,
    output_messages,
)
from lore_gateway.sse import SSEEvent, encode_event

from ._fixtures import FIXTURES, body_of, events, split_at_created

OR = FIXTURES / "openai-responses"
CODEX = FIXTURES / "codex"


def accumulate(evs: list[SSEEvent], mode: str = "public") -> ResponsesAccumulator:
    acc = ResponsesAccumulator(mode)  # type: ignore[arg-type]
    for ev in evs:
        acc.feed_event(ev)
    acc.close()
    return acc


def frames(*payloads: dict) -> list[SSEEvent]:
    out = []
    for p in payloads:
        raw = encode_event(p["type"], json.dumps(p))
        out.append(SSEEvent(event=p["type"], data=json.dumps(p), has_data=True, raw=raw))
    return out


def test_reasoning_then_three_calls_then_message_in_both_modes() -> None:
    groups = split_at_created(
        events(OR / "reasoning_summary_encrypted_3_function_calls.chunks.jsonl")
    )
    assert len(groups) == 4
    for mode in ("public", "codex"):
        results = [accumulate(g, mode).result() for g in groups]
        assert [r.stop_reason for r in results] == ["tool_use"] * 3 + ["end_turn"]
        first = results[0]
        assert [o["type"] for o in first.output] == ["reasoning", "function_call"]
        assert first.output[0]["encrypted_content"]
        assert first.reasoning_summaries and first.reasoning_summaries[0].startswith("**")
        assert [json.loads(r.tool_calls[0].arguments) for r in results[:3]] == [
            {"a": 12, "b": 7, "op": "add"},
            {"a": 19, "b": 3, "op": "multiply"},
            {"a": 57, "b": 10, "op": "multiply"},
        ]
        assert all(r.tool_calls[0].name == "calculator" for r in results[:3])
        assert results[3].text == "The final result is **570**."
        assert results[3].usage is not None
        assert (results[3].usage.input_tokens, results[3].usage.output_tokens) == (299, 12)


def test_single_function_call_accumulates_arguments() -> None:
    res = accumulate(events(OR / "function_call_single_get_weather.chunks.jsonl")).result()
    assert res.status == "completed" and res.stop_reason == "tool_use"
    (call,) = res.tool_calls
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["location"].startswith("San Francisco")
    assert res.usage is not None and res.usage.total_tokens == 493


def test_trimmed_deltas_fail_public_but_codex_keeps_done_text() -> None:
    evs = events(OR / "text_two_messages_with_phase.chunks.jsonl")
    with pytest.raises(
        ProtocolError,
        match=r"^Responses response.output_text.done text does not match streamed deltas "
        r"for index 0$",
    ):
        accumulate(evs)
    res = accumulate(evs, "codex").result()
    assert [o["phase"] for o in res.output] == ["commentary", "final_answer"]
    assert res.text.startswith("Got it — I’ll quickly check")
    assert res.usage is not None
    assert (res.usage.input_tokens, res.usage.cache_read) == (7112 - 3072, 3072)


def test_copilot_rotating_ids_pinned_in_codex_mode() -> None:
    evs = events(OR / "copilot_reasoning_item_id_rotation.chunks.jsonl")
    with pytest.raises(
        ProtocolError, match="^Responses response.in_progress changed response identity$"
    ):
        accumulate(evs)
    acc = accumulate(evs, "codex")
    res = acc.result()
    assert res.id == "capture-id-1"
    assert [o["type"] for o in res.output] == ["reasoning", "message"]
    assert res.text.startswith("There are **3** letter")
    assert res.reasoning_summaries == ["**Counting character occurrences**"]
    assert acc.response_body()["id"] == "capture-id-1"


def test_failed_streams_keep_the_error() -> None:
    res = accumulate(events(OR / "response_failed_only.chunks.jsonl")).result()
    assert (res.status, res.stop_reason) == ("failed", "stop")
    assert res.error is not None and res.error["code"] == "rate_limit_exceeded"
    acc = accumulate(events(OR / "error_event_then_response_failed.chunks.jsonl"))
    assert acc.error_event is not None and acc.error_event["error"]["code"] == "insufficient_quota"
    assert acc.result().status == "failed"


def test_incomplete_without_created_is_codex_only() -> None:
    evs = events(OR / "response_incomplete_after_function_call.synthetic.chunks.jsonl")
    with pytest.raises(
        ProtocolError, match="^Responses event before response.created: response.output_item.added$"
    ):
        accumulate(evs)
    res = accumulate(evs, "codex").result()
    assert (res.status, res.stop_reason, res.incomplete_reason) == (
        "incomplete",
        "max_tokens",
        "server_timeout",
    )
    assert res.tool_calls[0].name == "get_weather"


@pytest.mark.parametrize(
    ("name", "public_error"),
    [
        ("text_full_accepted.sse", None),
        ("text_with_codex_rate_limits_first_accepted.sse", None),
        ("failed_turn_errors.sse", None),
        ("incomplete_max_output_tokens_turn_errors.sse", None),
        ("minimal_created_itemdone_completed_accepted.sse", "malformed Responses response.created"),
        (
            "deltas_without_output_item_REJECTED_prints_nothing.sse",
            "Responses response.output_text.delta arrived before output_item.added for index 0",
        ),
        (
            "completed_only_REJECTED_prints_nothing.sse",
            "Responses terminal output changed streamed item",
        ),
    ],
)
def test_codex_served_streams_accumulate_in_codex_mode(name: str, public_error: str | None) -> None:
    evs = events(CODEX / "served-streams" / name)
    res = accumulate(evs, "codex").result()
    assert res.text == "Hi from the fake upstream!"
    if public_error is None:
        assert accumulate(evs).result().output == res.output
    else:
        with pytest.raises(ProtocolError, match=f"^{public_error}$"):
            accumulate(evs)


def test_codex_rate_limits_are_sanitised_and_kept() -> None:
    res = accumulate(
        events(CODEX / "served-streams" / "text_with_codex_rate_limits_first_accepted.sse"), "codex"
    ).result()
    assert res.rate_limits == [
        {
            "type": "codex.rate_limits",
            "plan_type": "plus",
            "rate_limits": {
                "primary": {"used_percent": 42.0, "window_minutes": 300, "reset_at": 1796041394},
                "secondary": {"used_percent": 5.0, "window_minutes": 10080, "reset_at": 1796124194},
            },
        }
    ]


def test_codex_minimal_fixture_item_done_without_index() -> None:
    res = accumulate(
        events(CODEX / "upstream-minimal" / "cli_responses_fixture.sse"), "codex"
    ).result()
    assert res.text == "fixture hello" and res.status == "completed" and res.usage is None


def test_recall_call_and_failed_and_incomplete_codex_turns() -> None:
    served = CODEX / "served-streams"
    rec = accumulate(
        events(served / "recall_function_call__codex_replies_unsupported_call.sse"), "codex"
    ).result()
    assert [(c.name, json.loads(c.arguments)) for c in rec.tool_calls] == [
        ("recall", {"query": "project conventions"})
    ]
    assert output_messages(rec) == [
        Message("assistant", '[tool_call:recall] {"query": "project conventions"}')
    ]
    inc = accumulate(
        events(served / "incomplete_max_output_tokens_turn_errors.sse"), "codex"
    ).result()
    assert (inc.status, inc.stop_reason, inc.incomplete_reason) == (
        "incomplete",
        "max_tokens",
        "max_output_tokens",
    )


def _created(rid: str = "resp_1", **extra: object) -> dict:
    return {
        "type": "response.created",
        "response": {"id": rid, "model": "m", "status": "in_progress", "output": [], **extra},
    }


def _msg_added(idx: int = 0, iid: str = "msg_1") -> dict:
    return {
        "type": "response.output_item.added",
        "output_index": idx,
        "item": {
            "type": "message",
            "id": iid,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        },
    }


@pytest.mark.parametrize(
    ("payloads", "message"),
    [
        ([_created(), _created()], "duplicate response.created"),
        ([_created(output=[{"type": "message"}])], "response.created must start with empty output"),
        (
            [_created(), {**_msg_added(), "output_index": None}],
            "invalid Responses output_index for response.output_item.added",
        ),
        (
            [_created(), _msg_added(), {**_msg_added(1, "msg_1")}],
            "duplicate Responses item identity",
        ),
        (
            [
                _created(),
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {
                        "type": "function_call",
                        "id": "x",
                        "call_id": "x",
                        "name": "f",
                        "arguments": "",
                    },
                },
            ],
            "duplicate Responses identity within output item",
        ),
        (
            [
                _created(),
                _msg_added(),
                {
                    "type": "response.output_text.delta",
                    "output_index": 0,
                    "item_id": "other",
                    "content_index": 0,
                    "delta": "a",
                },
            ],
            "Responses response.output_text.delta changed item_id for index 0",
        ),
        (
            [
                _created(),
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []},
                },
            ],
            "Responses response.output_item.done arrived before output_item.added for index 0",
        ),
        (
            [
                _created(),
                _msg_added(),
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": {"type": "message", "id": "msg_2", "role": "assistant", "content": []},
                },
            ],
            "Responses output_item.done changed item identity for index 0",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {
                        "id": "resp_1",
                        "model": "m",
                        "status": "in_progress",
                        "output": [],
                    },
                },
            ],
            "Responses terminal event has nonterminal status",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {
                        "id": "resp_1",
                        "model": "m",
                        "status": "incomplete",
                        "output": [],
                    },
                },
            ],
            "Responses terminal event contradicts response status",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {"id": "resp_1", "model": "m", "output": []},
                },
            ],
            "missing Responses compatibility terminal status",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {"id": "resp_1", "model": "m", "status": "completed", "output": {}},
                },
            ],
            "Responses terminal output must be an array",
        ),
        (
            [
                _created(),
                _msg_added(),
                {
                    "type": "response.completed",
                    "response": {"id": "resp_1", "model": "m", "status": "completed", "output": []},
                },
            ],
            "Responses stream ended before output_item.done for index 0",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {
                        "id": "resp_1",
                        "model": "m",
                        "status": "completed",
                        "output": [],
                        "usage": {"input_tokens": -1},
                    },
                },
            ],
            "malformed Responses usage",
        ),
        (
            [
                _created(),
                {
                    "type": "response.completed",
                    "response": {"id": "resp_1", "model": "m", "status": "completed", "output": []},
                },
                {"type": "response.in_progress", "response": {}},
            ],
            "Responses event after terminal: response.in_progress",
        ),
        (
            [
                _created(sequence_number=None),
                {**_created(), "type": "response.in_progress", "sequence_number": 3},
                {**_msg_added(), "sequence_number": 3},
            ],
            "Responses sequence_number did not increase at response.output_item.added",
        ),
    ],
)
def test_public_lifecycle_errors(payloads: list[dict], message: str) -> None:
    acc = ResponsesAccumulator("public")
    with pytest.raises(ProtocolError) as info:
        for ev in frames(*payloads):
            acc.feed_event(ev)
    assert str(info.value) == message


def test_missing_terminal_and_frame_errors() -> None:
    acc = ResponsesAccumulator()
    acc.feed_event(frames(_created())[0])
    with pytest.raises(ProtocolError, match="^missing terminal response status$"):
        acc.close()
    bad = SSEEvent(event="response.output_text.delta", data="{not json", has_data=True, raw=b"")
    with pytest.raises(
        ProtocolError, match="^malformed JSON in Responses event response.output_text.delta$"
    ):
        ResponsesAccumulator().feed_event(bad)
    mismatch = SSEEvent(
        event="response.created", data='{"type":"response.completed"}', has_data=True, raw=b""
    )
    with pytest.raises(
        ProtocolError, match="^Responses payload type does not match response.created$"
    ):
        ResponsesAccumulator().feed_event(mismatch)
    # [DONE], empty data and comment frames are skipped, not errors.
    acc = ResponsesAccumulator()
    for data, has in (("[DONE]", True), ("", True), ("", False)):
        acc.feed_event(SSEEvent(event=None, data=data, has_data=has, raw=b""))
    assert not acc.done


def test_codex_sparse_function_call_resolved_and_unresolved() -> None:
    call_delta = {"type": "response.function_call_arguments.delta", "delta": '{"q":1}'}
    done = {
        "type": "response.output_item.done",
        "item": {"type": "function_call", "call_id": "call_9", "name": "lookup", "arguments": ""},
    }
    terminal = {"type": "response.completed", "response": {"id": "r", "output": []}}
    acc = ResponsesAccumulator("codex")
    for ev in frames(
        {"type": "response.created", "response": {"id": "r"}}, call_delta, done, terminal
    ):
        acc.feed_event(ev)
    (call,) = acc.result().tool_calls
    assert (call.call_id, call.name, call.arguments) == ("call_9", "lookup", '{"q":1}')
    acc = ResponsesAccumulator("codex")
    with pytest.raises(
        ProtocolError, match="^Responses terminal left sparse function identity unresolved$"
    ):
        for ev in frames(
            {"type": "response.created", "response": {"id": "r"}}, call_delta, terminal
        ):
            acc.feed_event(ev)


def test_response_body_from_public_stream_equals_terminal_response() -> None:
    evs = events(OR / "function_call_single_get_weather.chunks.jsonl")
    acc = accumulate(evs)
    terminal = json.loads(evs[-1].data)["response"]
    assert acc.response_body() == terminal


def test_new_input_messages_on_captured_codex_requests() -> None:
    for name in (
        "apikey_custom_provider__turn1_request.json",
        "chatgpt_login_custom_provider__backend_api_codex_responses_request.json",
        "chatgpt_login_builtin_provider__zstd_request_decompressed.json",
    ):
        body = body_of(f"codex/captured-requests/{name}")
        assert new_input_messages(body) == [Message("user", "say hi")], name
    for name in (
        "apikey_custom_provider__after_unknown_recall_call_request.json",
        "chatgpt_login_custom_provider__after_unknown_recall_call_request.json",
    ):
        body = body_of(f"codex/captured-requests/{name}")
        (msg,) = new_input_messages(body)
        assert msg.role == "tool" and msg.text.endswith("] unsupported call: recall")
        assert msg.text.startswith("[tool:call_")
    assert new_input_messages({"input": "plain"}) == [Message("user", "plain")]


def test_output_messages_include_reasoning_summary_never_encrypted() -> None:
    first = split_at_created(
        events(OR / "reasoning_summary_encrypted_3_function_calls.chunks.jsonl")
    )[0]
    msgs = output_messages(accumulate(first))
    assert msgs[0].text.startswith("[reasoning] **") and msgs[1].text.startswith(
        "[tool_call:calculator] {"
    )
    assert all("gAAAA" not in m.text for m in msgs)
