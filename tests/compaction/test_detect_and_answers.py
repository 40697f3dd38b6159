"""Compaction requests recognised by structure, never side channels; the answers'
shapes; our compaction handle expanded back (sans-IO parts of compaction/)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson

from lore_gateway.compaction import answers, summary
from lore_gateway.compaction.detect import Flow, detect
from lore_gateway.distill.format import HIGH, LOW, MEDIUM, Observation
from lore_gateway.knowledge.sidechannel import is_coding_turn
from lore_gateway.memory.store.records import Identity
from lore_gateway.pipeline import transforms as pipeline
from lore_gateway.protocols.anthropic_stream import AnthropicAccumulator
from lore_gateway.protocols.history_anthropic import ANTHROPIC
from lore_gateway.protocols.history_chat import CHAT
from lore_gateway.protocols.history_responses import RESPONSES
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.routing import Protocol
from lore_gateway.sse import SSEDecoder

HERE = Path(__file__).resolve().parent
# Claude Code 2.1.197's `/compact`, captured against the fake upstream (trimmed).
CLAUDE_COMPACT = json.loads((HERE / "claude_code_compact_request.json").read_text())
CODEX_META = json.dumps({"request_kind": "compaction", "session_id": "s"})


def test_claude_code_summary_fork_is_detected() -> None:
    assert detect(ANTHROPIC, CLAUDE_COMPACT, {}) is Flow.CLAUDE_SUMMARY


def test_claude_code_normal_turn_is_not_a_compaction() -> None:
    turn = copy.deepcopy(CLAUDE_COMPACT)
    last = turn["messages"][-1]
    last["content"] = [last["content"][0] | {"cache_control": {"type": "ephemeral"}}]
    assert detect(ANTHROPIC, turn, {}) is None


def test_summary_prompt_on_the_cache_marked_message_is_not_the_fork() -> None:
    """The fork leaves the marker on the message before; a user who pastes the
    prompt into a normal turn (marker on the last message) is just talking."""
    turn = copy.deepcopy(CLAUDE_COMPACT)
    turn["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    assert detect(ANTHROPIC, turn, {}) is None


def test_side_channels_are_never_compactions() -> None:
    title = {"model": "claude-haiku-4-5", "max_tokens": 512,
             "system": [{"type": "text", "text": "Generate a short title."}],
             "messages": [{"role": "user", "content": "Write a summary of the conversation"
                           " so far as a <summary> title"}]}
    classifier = {**title, "stop_sequences": ["</block>"]}
    for request in (title, classifier):
        assert not is_coding_turn("anthropic", request, {})
        assert detect(ANTHROPIC, request, {}) is None
    codex_title = {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Summarize this thread in 5 words"}]}]}
    meta = json.dumps({"request_kind": "title"})
    assert detect(RESPONSES, codex_title, {"x-codex-turn-metadata": meta}) is None
    worker = {"input": [{"type": "compaction_trigger"}]}
    assert detect(RESPONSES, worker, {"x-lore-worker": "distill"}) is None


def test_codex_flows_are_detected() -> None:
    prompt = {"type": "message", "role": "user", "content": [{"type": "input_text", "text":
              "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"}]}
    assert detect(RESPONSES, {"input": [prompt]}, {}) is Flow.CODEX_LOCAL
    user = {"type": "message", "role": "user", "content": "hi"}
    assert detect(RESPONSES, {"input": [user]}, {"x-codex-turn-metadata": CODEX_META}) \
        is Flow.CODEX_LOCAL
    assert detect(RESPONSES, {"input": [user, {"type": "compaction_trigger"}]}, {}) \
        is Flow.CODEX_TRIGGER
    assert detect(RESPONSES, {"input": [user]}, {}) is None
    assert detect(CHAT, {"messages": [prompt]}, {}) is None


def _dated(mark: str, text: str, clock: str = "09:14") -> summary.Dated:
    return summary.Dated("Date: Dec 1, 2026", Observation(mark, clock, text))


MEMORY = summary.SessionMemory(
    observations=(_dated(HIGH, "User: deploy from the tangerine branch"),
                  _dated(LOW, "Files: src/app.py", "09:30")),
    messages=40, source_chars=200_000,
    last_request="Read both notes files.", last_reply="Both files are build logs.",
    knowledge="## Long-term knowledge (lore-gateway)\n* **Tabs**: tabs in src/",
)


def test_summary_holds_every_layer_of_memory_and_points_at_recall() -> None:
    text = summary.render(MEMORY)
    assert text.startswith(summary.SUMMARY_HEADING)
    for part in ("tangerine branch", "src/app.py", "Both files are build logs",
                 "Read both notes files", "**Tabs**", "`recall`", "2 observations, all of them"):
        assert part in text
    assert "nothing was lost" not in text
    assert summary.SessionMemory((), 0, 0).empty


def test_a_summary_takes_a_tenth_of_the_session_and_keeps_findings_over_minor_lines() -> None:
    findings = tuple(_dated(MEDIUM, f"Error in `pytest`: ValueError_{i} in src/m{i}.py")
                     for i in range(200))
    minor = tuple(_dated(LOW, f"Ran `ls dir{i}`") for i in range(200))
    memory = summary.SessionMemory(findings + minor, 400, 60_000)
    text = summary.render(memory)
    assert len(text) <= 6_000  # a tenth of the session
    assert 20 < text.count("ValueError_") < 200  # as many as fit, not all
    # A minor line only takes room too small for any finding left out.
    left_out = [d.observation for d in findings if d.observation.text not in text]
    minor_room = sum(len(d.observation.text) + 6 for d in minor if d.observation.text in text)
    assert minor_room < min(len(o.text) + 6 for o in left_out)
    assert "chosen for the facts they carry" in text
    huge = summary.SessionMemory(findings, 400, 10_000_000)
    assert len(summary.render(huge)) <= summary.MAX_SUMMARY_CHARS


def test_early_and_late_findings_both_survive_the_cut() -> None:
    early = _dated(MEDIUM, "Error in `make`: KeyError: 'tangerine_config'", "08:00")
    filler = tuple(_dated(MEDIUM, f"Output of `run`: value {i}", "09:00") for i in range(300))
    late = _dated(MEDIUM, "Result in `pytest -q`: 12 passed, 1 failed in 0.41s", "17:00")
    text = summary.render(summary.SessionMemory((early, *filler, late), 500, 40_000))
    assert "tangerine_config" in text and "12 passed, 1 failed" in text


def _events(body: bytes) -> list[Any]:
    decoder = SSEDecoder()
    return [*decoder.feed(body), *decoder.close()]


def test_claude_answer_streams_an_analysis_and_a_summary() -> None:
    acc = AnthropicAccumulator()
    for event in _events(answers.anthropic_answer("THE SUMMARY", "claude-opus-4-8", True)):
        acc.feed_event(event)
    acc.close()
    text = acc.result().text
    assert "<analysis>" in text and "<summary>\nTHE SUMMARY\n</summary>" in text
    message = orjson.loads(answers.anthropic_answer("THE SUMMARY", "m", False))
    assert message["role"] == "assistant" and message["stop_reason"] == "end_turn"


def test_compaction_trigger_gets_exactly_one_compaction_item() -> None:
    acc = ResponsesAccumulator(mode="public")
    for event in _events(answers.responses_compaction_answer("S", "gpt-5", True)):
        acc.feed_event(event)
    acc.close()
    done = [e for e in _events(answers.responses_compaction_answer("S", "gpt-5", True))
            if e.event == "response.output_item.done"]
    assert len(done) == 1
    item = orjson.loads(done[0].data)["item"]
    assert item["type"] == "compaction"
    assert item["encrypted_content"].startswith(answers.HANDLE_PREFIX)
    assert answers.summary_of_handle(item["encrypted_content"]) == "S"


def test_our_compaction_item_is_expanded_before_forwarding_and_openais_kept() -> None:
    ours = answers.compaction_item("Summary with the tangerine branch.")
    theirs = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA-openai"}
    user = {"type": "message", "role": "user", "content": "go on"}
    payload = {"model": "gpt-5", "input": [theirs, ours, user]}
    ctx = pipeline.request_context(Protocol.RESPONSES, {}, Identity("t", "p", "s"))
    out = pipeline.expand_compaction(payload, ctx)
    assert out["input"][0] is theirs and out["input"][2] is user
    expanded = out["input"][1]
    assert expanded["role"] == "user"
    assert "tangerine branch" in expanded["content"][0]["text"]
    assert answers.HANDLE_PREFIX not in orjson.dumps(out).decode()
    # Expanding twice gives the same bytes: the provider's prompt cache keeps hitting.
    assert orjson.dumps(pipeline.expand_compaction(payload, ctx)) == orjson.dumps(out)
    plain = {"input": [theirs, user]}
    assert pipeline.expand_compaction(plain, ctx) is plain


def test_claude_code_fallback_summary_path_is_detected() -> None:
    prompt = CLAUDE_COMPACT["messages"][-1]["content"][-1]["text"]
    fallback = {"model": "claude-opus-4-8", "max_tokens": 20000,
                "system": [{"type": "text", "text": "You are a helpful AI assistant tasked with"
                            " summarizing conversations."}],
                "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
                "messages": [{"role": "user", "content": "earlier work"},
                             {"role": "assistant", "content": "done"},
                             {"role": "user", "content": [{"type": "text", "text": prompt}]}]}
    assert detect(ANTHROPIC, fallback, {}) is Flow.CLAUDE_SUMMARY
