"""Untouched relay of a recall-watched Responses stream (``recall/responses/gate.py``,
``principal.py``), sans-IO: whatever the stream and however it is cut into reads,
the client, the recall chain and storage get exactly what the interceptor fed
every frame gives them."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.memory.store.answer_scan import responses_output
from lore_gateway.protocols.common import Message, ProtocolError
from lore_gateway.recall.core.budget import RecallChainBudget
from lore_gateway.recall.responses.gate import TERMINAL_MAX_BYTES
from lore_gateway.recall.responses.live import Action, Limits, LiveInterceptor, Send
from lore_gateway.recall.responses.principal import PrincipalReader
from lore_gateway.recall.responses.stored import turn_messages
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_wire import jsonl_frames

MODEL = "gpt-fake"
RECALL_ARGS = orjson.dumps({"query": "deploy target"}).decode()
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
BROKEN_DELTA = (b"event: response.output_text.delta\n"
                b'data: {"type":"response.output_text.delta","delta":\n\n')
TEXT = "The deploy target is the blue cluster, rotated weekly by the platform team."


@dataclass
class Outcome:
    client: bytes  # every byte the client got, in order
    action: Action | None  # the first action other than a write
    delivered: dict[str, Any] | None
    stored: list[Message]
    untouched: bool


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _run(reads: list[bytes], *, gated: bool, limits: Limits | None = None) -> Outcome:
    """Feed ``reads`` as the shell does, with the gate (``PrincipalReader``) or as
    before it (every read decoded and fed), up to the first action that is not a
    write; then what the client, the chain and storage got."""
    icpt = LiveInterceptor(budget=RecallChainBudget(), limits=limits)
    reader = PrincipalReader(icpt)
    decoder = SSEDecoder()
    out: list[Action] = []
    try:
        for data in reads:
            out += reader.feed(data) if gated else icpt.feed_all(decoder.feed(data))
            if any(not isinstance(a, Send) for a in out):
                break
        else:
            out += reader.end() if gated else icpt.feed_all(decoder.close())
            if all(isinstance(a, Send) for a in out):
                out += icpt.end_of_stream()
    except ProtocolError as exc:  # the shell reports it as a broken body
        out += [*(reader.broken() if gated else []),
                *icpt.follow_up_failed("principal_transport", str(exc))]
    rest = [a for a in out if not isinstance(a, Send)]
    client = b"".join(a.data for a in out if isinstance(a, Send))
    untouched = reader.untouched() if gated else None
    if untouched is not None:
        stored = responses_output(untouched)
        assert stored is not None, "storage could not read an untouched terminal"
    else:
        stored = turn_messages(icpt.turn_items())
    return Outcome(client, rest[0] if rest else None, icpt.delivered_response(), stored,
                   untouched is not None)


def _frames(answer: fs.Answer) -> list[bytes]:
    return list(answer.frames)


def _bent(frames: list[bytes], at: int, frame: bytes) -> list[bytes]:
    return [*frames[:at], frame, *frames[at:]]


def _streams() -> dict[str, list[bytes]]:
    text = _frames(fs.responses_text(TEXT, MODEL, 12))
    delta = text[5]
    streams = {
        "text": text,
        "text-one-delta": _frames(fs.responses_text("ok", MODEL, 1)),
        "rate-limits-first": [fs.codex_rate_limits_frame(12.5), *text],
        "rate-limits-mid": _bent(text, 6, fs.codex_rate_limits_frame(40.0)),
        "other-tool": _frames(fs.responses_call("read_file", '{"path":"a.py"}', MODEL)),
        "recall": _frames(fs.responses_call("recall", RECALL_ARGS, MODEL)),
        "recall-after-text": _frames(fs.responses_calls((("recall", RECALL_ARGS),), MODEL,
                                                        preamble="Let me check.")),
        "failed": _frames(fs.responses_failed(MODEL)),
        "incomplete": _frames(fs.responses_incomplete(TEXT, MODEL)),
        "minimal": _frames(fs.responses_minimal(TEXT, MODEL)),
        "missing-terminal": text[:-1],
        "malformed-delta": _bent(text, 7, BROKEN_DELTA),
        "mistyped-delta": _bent(text, 7, delta.replace(b"event: response.output_text.delta",
                                                       b"event: response.refusal.delta")),
        "seq-backwards": _bent(text, 8, delta),
        "bool-seq": _bent(text, 8, delta.replace(b'"sequence_number":5',
                                                 b'"sequence_number":true')),
        "unknown-event": _bent(text, 6, b"event: vendor.note\ndata: not json\n\n"),
        "comment": _bent(text, 6, b": keepalive\n\n"),
        "done-marker": _bent(text, 6, b"data: [DONE]\n\n"),
        "empty-data": _bent(text, 6, b"data: \n\n"),
        "crlf": [f.replace(b"\n", b"\r\n") for f in text],
        "crlf-late": [*text[:6], *(f.replace(b"\n", b"\r\n") for f in text[6:])],
        "after-terminal": [*text, b"data: [DONE]\n\n"],
        "duplicate-created": _bent(text, 4, text[0]),
        "function-call-word": _frames(fs.responses_text(
            'Use "function_call" items, or a function_call_output.', MODEL, 6)),
    }
    assert delta.startswith(b"event: response.output_text.delta")
    assert b'"sequence_number":5' in delta
    for path in sorted((FIXTURES / "openai-responses").glob("*.chunks.jsonl")):
        streams[f"recorded-{path.name}"] = list(jsonl_frames(path.read_bytes()))
    for path in sorted((FIXTURES / "codex" / "served-streams").glob("*.sse")):
        data = path.read_bytes()
        streams[f"recorded-{path.name}"] = [f + b"\n\n" for f in data.split(b"\n\n") if f]
    return streams


STREAMS = _streams()


def _cuttings(data: bytes, frames: list[bytes], seed: int) -> dict[str, list[bytes]]:
    ends = [sum(map(len, frames[: i + 1])) for i in range(len(frames))]
    rng = random.Random(seed)
    cuts = {
        "whole": [data],
        "per-frame": _split(data, ends),
        "created-alone": _split(data, ends[:1]),
        "two-reads": _split(data, [ends[len(ends) // 2]]),
    }
    for n in range(4):
        cuts[f"random-{n}"] = _split(data, [rng.randrange(1, len(data)) for _ in range(n + 2)])
    return cuts


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_gate_changes_nothing_anyone_sees(name: str) -> None:
    frames = STREAMS[name]
    data = b"".join(frames)
    for cut, reads in _cuttings(data, frames, seed=len(name)).items():
        before = _run(reads, gated=False)
        after = _run(reads, gated=True)
        where = f"{name}, {cut}"
        assert after.client == before.client, where
        assert after.action == before.action, where
        assert after.delivered == before.delivered, where
        assert after.stored == before.stored, where


@pytest.mark.parametrize("name", [
    "text", "text-one-delta", "rate-limits-first", "incomplete", "failed-with-output",
    "recorded-text_with_codex_rate_limits_first_accepted.sse", "recorded-text_full_accepted.sse",
    "recorded-text_two_messages_with_phase.chunks.jsonl",
    "recorded-copilot_reasoning_item_id_rotation.chunks.jsonl"])
def test_an_answer_without_calls_is_relayed_untouched_and_stored_from_its_bytes(
        name: str) -> None:
    """The point of the gate: a plain answer, in any reads after the first frame,
    never goes through the interceptor frame by frame."""
    frames = (STREAMS[name] if name != "failed-with-output"
              else _frames(fs.responses_incomplete(TEXT, MODEL)))
    data = b"".join(frames)
    cuttings = _cuttings(data, frames, seed=1)
    cuttings["first-frame-alone"] = _split(data, [len(frames[0])])
    for cut in ("whole", "per-frame", "two-reads", "random-1", "first-frame-alone"):
        assert _run(cuttings[cut], gated=True).untouched, f"{name}, {cut}"


@pytest.mark.parametrize("name", ["recall", "recall-after-text", "other-tool", "minimal",
                                  "function-call-word", "rate-limits-mid", "missing-terminal"])
def test_streams_the_gate_cannot_vouch_for_are_tracked_by_the_interceptor(name: str) -> None:
    frames = STREAMS[name]
    assert not _run([b"".join(frames)], gated=True).untouched


def test_an_answer_too_long_to_store_from_its_terminal_is_tracked_by_the_interceptor() -> None:
    """Its deltas still go out untouched; at the terminal (over
    ``TERMINAL_MAX_BYTES``) the interceptor catches up on the items."""
    frames = _frames(fs.responses_text("word " * (TERMINAL_MAX_BYTES // 4), MODEL, 400))
    data = b"".join(frames)
    assert len(frames[-1]) > TERMINAL_MAX_BYTES
    reads = _split(data, list(range(4096, len(data), 4096)))
    after = _run(reads, gated=True)
    before = _run(reads, gated=False)
    assert not after.untouched
    assert (after.client, after.action, after.stored) == (before.client, before.action,
                                                          before.stored)
    assert after.stored and after.stored[0].text.startswith("word word")


def test_the_interceptors_limits_hold_through_the_gate() -> None:
    """A stream over the byte limit fails the same way, gate or no gate."""
    frames = STREAMS["text"]
    data = b"".join(frames)
    limits = Limits(stream_bytes=len(data) // 2)
    reads = _split(data, [len(frames[0]), len(data) // 3, 2 * len(data) // 3])
    before = _run(reads, gated=False, limits=limits)
    after = _run(reads, gated=True, limits=limits)
    assert b"response.failed" in before.client
    assert (after.client, after.action) == (before.client, before.action)


def test_an_event_over_the_decoders_limit_fails_as_before() -> None:
    """One delta over 4 MiB: the gate leaves it to the decoder, which fails the
    stream with its limit, as it did before the gate. As for a frame that is not
    UTF-8, frames of the same read before it may now go out first (here the
    first read's ``response.created``, so the failure carries the response's id)."""
    frames = STREAMS["text"]
    huge = frames[5].replace(b'"delta":"', b'"delta":"' + b"x" * (4 * 1024 * 1024), 1)
    data = b"".join([*frames[:5], huge, *frames[6:]])
    for reads in ([data], _split(data, list(range(len(frames[0]), len(data), 1 << 20)))):
        before, after = _run(reads, gated=False), _run(reads, gated=True)
        assert after.action == before.action
        sent, failed = after.client.rsplit(b"event: response.failed\n", 1)
        assert data.startswith(sent) and b"SSE event exceeded 4194304 byte limit" in failed
        assert b"SSE event exceeded 4194304 byte limit" in before.client
        assert after.client.count(b"response.failed") == before.client.count(b"response.failed")
