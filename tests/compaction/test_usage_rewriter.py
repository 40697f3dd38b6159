"""The usage rewriter: caps, chunk boundaries anywhere, untouched bytes elsewhere."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lore_gateway.compaction.usage import (
    Agent,
    UsageCap,
    UsageRewriter,
    claude_cap,
    client_agent,
    codex_cap,
)
from lore_gateway.protocols.history_anthropic import ANTHROPIC
from lore_gateway.protocols.history_responses import RESPONSES
from lore_gateway.sse import SSEDecoder
from lore_gateway.testing import fake_compaction
from lore_gateway.testing import fake_streams as fs


def test_caps_follow_the_agents_formulas() -> None:
    assert claude_cap(200_000, 64_000) == 150_300  # 0.9 × (200K − 20K − 13K)
    assert claude_cap(200_000, 8_000) == 161_100  # a smaller output reserve
    assert codex_cap(272_000) == 220_320  # 0.9 × ⌊0.9 × 272K⌋
    assert client_agent({"originator": "codex_exec"}) is Agent.CODEX
    assert client_agent({"user-agent": "claude-cli/2.1.197 (external, sdk-cli)"}) \
        is Agent.CLAUDE_CODE
    assert client_agent({"user-agent": "Anthropic/Python 2.14.0"}) is None


def _stream(api: str, answer: fs.Answer, tokens: int) -> bytes:
    return b"".join(fake_compaction.with_input_tokens(answer, api, tokens).frames)


def _rewrite(cap: UsageCap, data: bytes, step: int) -> bytes:
    rewriter = UsageRewriter(cap)
    out = b"".join(rewriter.feed(data[i:i + step]) for i in range(0, len(data), step))
    return out + rewriter.close()


def _usages(data: bytes) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    found = []
    for event in [*decoder.feed(data), *decoder.close()]:
        payload = orjson.loads(event.data)
        for holder in (payload, payload.get("message"), payload.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
                found.append(holder["usage"])
    return found


@pytest.mark.parametrize("step", [1, 7, 64, 100_000])
def test_anthropic_stream_capped_at_any_chunking(step: int) -> None:
    data = _stream("anthropic", fs.anthropic_text("hello there", "claude-x"), 400_000)
    out = _rewrite(UsageCap(150_300, ANTHROPIC), data, step)
    start, _delta = _usages(out)
    assert start["input_tokens"] + start["output_tokens"] <= 150_300
    assert start["input_tokens"] > 140_000
    # Frames without usage are byte-identical.
    frames = [f for f in data.split(b"\n\n") if f and b'"usage"' not in f]
    assert all(f in out for f in frames)


@pytest.mark.parametrize("step", [3, 100_000])
def test_responses_stream_capped_and_consistent(step: int) -> None:
    data = _stream("responses", fs.responses_text("hi", "gpt-5"), 900_000)
    out = _rewrite(UsageCap(220_320, RESPONSES), data, step)
    (usage,) = [u for u in _usages(out) if u]
    assert usage["total_tokens"] <= 220_320
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_under_the_cap_nothing_changes() -> None:
    data = b"".join(fs.responses_text("hi", "gpt-5").frames)
    rewriter = UsageRewriter(UsageCap(220_320, RESPONSES))
    assert rewriter.feed(data) + rewriter.close() == data
    assert rewriter.scaled == 0
    body = fs.anthropic_text("hi", "c").body
    assert UsageRewriter(UsageCap(150_300, ANTHROPIC)).json_body(body) == body


def test_json_bodies_are_capped() -> None:
    body = fake_compaction.with_input_tokens(fs.responses_text("hi", "gpt-5"), "responses",
                                             900_000).body
    usage = orjson.loads(UsageRewriter(UsageCap(1_000, RESPONSES)).json_body(body))["usage"]
    assert usage["total_tokens"] <= 1_000
