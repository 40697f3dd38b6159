"""A plain relay (no recall tool) hands the event stream the client got to
storage as it is (``TurnOutcome.raw``): the output is parsed where the
turn is written, and only the usage is read on the event loop. Both must be
what the collector reading the same bytes on the loop gave before: the stored
messages and the usage, on every fake stream shape, bent streams and every
recorded provider stream in ``shared/fixtures``."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from lore_gateway.collector import TurnCollector, raw_outputs, stream_usage
from lore_gateway.memory.store.records import RawOutputs
from lore_gateway.routing import Protocol
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_wire import jsonl_frames

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
MODEL = "gpt-fake"
TEXT = "The deploy target is the blue cluster, rotated weekly — by the platform team."
# What the relay's collector kept of an answer's text (settings' default + 1).
STORED_CHARS = 256 * 1024 + 1


def _recorded(folder: str) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for path in sorted((FIXTURES / folder).rglob("*")):
        if path.name.endswith(".chunks.jsonl"):
            found[f"recorded-{path.name}"] = b"".join(jsonl_frames(path.read_bytes()))
        elif path.suffix == ".sse":
            found[f"recorded-{path.name}"] = path.read_bytes()
    return found


def _first_item_only(terminal: bytes) -> bytes:
    """A terminal whose output leaves out all but the first item."""
    line, _, data = terminal.rstrip(b"\n").partition(b"\ndata: ")
    payload = orjson.loads(data)
    payload["response"]["output"] = payload["response"]["output"][:1]
    return line + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _responses() -> dict[str, bytes]:
    text = list(fs.responses_text(TEXT, MODEL, 12).frames)
    two = [*text, *fs.responses_text("A second answer.", MODEL, 3).frames]
    calls = list(fs.responses_calls((("read_file", "{}"), ("grep", '{"q":"x"}')), MODEL,
                                    preamble="Let me look.").frames)
    streams = {
        "text": text,
        "rate-limits-first": [fs.codex_rate_limits_frame(12.5), *text],
        "call": list(fs.responses_call("read_file", '{"path":"a.py"}', MODEL).frames),
        "calls-after-text": calls,
        "failed": list(fs.responses_failed(MODEL).frames),
        "incomplete": list(fs.responses_incomplete(TEXT, MODEL).frames),
        "minimal": list(fs.responses_minimal(TEXT, MODEL).frames),
        "missing-terminal": text[:-1],
        "terminal-only": text[-1:],
        "terminal-named-done": [*text[:-1], text[-1].replace(b"response.completed",
                                                             b"response.done", 2)],
        "duplicate-created": [*text[:4], text[0], *text[4:]],
        "two-responses": two,
        "terminal-output-short": [*calls[:-1], _first_item_only(calls[-1])],
        "malformed-delta": [*text[:7], b'event: response.output_text.delta\ndata: {"type\n\n',
                            *text[7:]],
    }
    found = {name: b"".join(frames) for name, frames in streams.items()}
    found.update(_recorded("openai-responses"))
    found.update(_recorded("codex"))
    return found


def _chat() -> dict[str, bytes]:
    found = {
        "text": b"".join(fs.chat_text(TEXT, MODEL, True).frames),
        "text-no-usage": b"".join(fs.chat_text(TEXT, MODEL, False, "length").frames),
        "call": b"".join(fs.chat_call("read_file", "{}", MODEL, True).frames),
        "error": b"".join(fs.chat_error_frames()),
    }
    found.update(_recorded("chat-completions"))
    return found


def _anthropic() -> dict[str, bytes]:
    found = {
        "text": b"".join(fs.anthropic_text(TEXT, MODEL).frames),
        "call": b"".join(fs.anthropic_call("read_file", "{}", MODEL).frames),
        "minimal": b"".join(fs.anthropic_minimal(TEXT, MODEL).frames),
        "error": b"".join(fs.anthropic_error_frames()),
    }
    found.update(_recorded("anthropic"))
    found.update(_recorded("claude-code"))
    return found


CASES = [
    *((Protocol.RESPONSES, name, body) for name, body in _responses().items()),
    *((Protocol.CODEX, name, body) for name, body in _responses().items()),
    *((Protocol.CHAT, name, body) for name, body in _chat().items()),
    *((Protocol.ANTHROPIC, name, body) for name, body in _anthropic().items()),
]


@pytest.mark.parametrize(("protocol", "name", "body"), CASES,
                         ids=[f"{p.value}-{n}" for p, n, _ in CASES])
def test_storage_reads_a_relayed_stream_as_the_relays_collector_did(
        protocol: Protocol, name: str, body: bytes) -> None:
    collector = TurnCollector(protocol, max_json_bytes=len(body) + 1,
                              max_text_chars=STORED_CHARS)
    collector.feed(body)
    assert raw_outputs(RawOutputs(protocol.value, body, ())) == collector.outputs()
    assert stream_usage(protocol, body) == collector.usage()


def test_the_cases_cover_what_storage_reads_both_ways() -> None:
    """Both of storage's ways are taken: the terminal alone, and the full parse."""
    from lore_gateway.memory.store.answer_scan import responses_output

    read = {name for name, body in _responses().items() if responses_output(body) is not None}
    assert {"text", "call", "calls-after-text", "terminal-only", "terminal-named-done"} <= read
    assert not read & {"minimal", "duplicate-created", "two-responses", "terminal-output-short",
                       "failed", "missing-terminal"}
