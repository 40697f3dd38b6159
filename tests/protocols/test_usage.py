"""Usage normalisation, merging and wire rendering; codex.rate_limits sanitising."""

from __future__ import annotations

import pytest

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.ratelimits import MAX_EVENTS, RateLimitLog, sanitize_rate_limits
from lore_gateway.protocols.usage import (
    Usage,
    merge_usage,
    usage_from_anthropic,
    usage_from_chat,
    usage_from_responses,
    usage_to_anthropic,
    usage_to_chat,
    usage_to_responses,
)


def test_responses_usage_is_inclusive_on_the_wire_and_disjoint_inside() -> None:
    wire = {
        "input_tokens": 7112,
        "input_tokens_details": {"cached_tokens": 3072},
        "output_tokens": 463,
        "output_tokens_details": {"reasoning_tokens": 64},
        "total_tokens": 7575,
    }
    u = usage_from_responses(wire)
    assert u == Usage(input_tokens=4040, output_tokens=463, cache_read=3072, reasoning_tokens=64)
    assert usage_to_responses(u) == wire


def test_absent_cache_fields_stay_absent() -> None:
    u = usage_from_anthropic({"input_tokens": 5, "output_tokens": 2})
    assert u.cache_read is None and u.cache_write is None
    assert usage_to_anthropic(u) == {"input_tokens": 5, "output_tokens": 2}
    assert "prompt_tokens_details" not in usage_to_chat(u)


def test_anthropic_and_chat_round_trip() -> None:
    a = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 3,
        "cache_read_input_tokens": 7,
        "output_tokens": 4,
    }
    u = usage_from_anthropic(a)
    assert (u.prompt_tokens, u.total_tokens) == (20, 24)
    assert usage_to_anthropic(u) == a
    chat = usage_to_chat(u)
    assert chat["prompt_tokens"] == 20 and chat["prompt_tokens_details"]["cached_tokens"] == 7
    assert usage_from_chat(chat) == Usage(10, 4, cache_read=7, cache_write=3)


def test_merge_sums_and_keeps_cache_only_when_reported() -> None:
    a = Usage(10, 5)
    b = Usage(3, 1, cache_read=2)
    assert a.merge(b) == Usage(13, 6, cache_read=2)
    assert a.merge(Usage(1, 1)).cache_read is None
    assert merge_usage(None, b) is b and merge_usage(a, None) is a


@pytest.mark.parametrize(
    "wire",
    [
        {"input_tokens": -1},
        {"output_tokens": "3"},
        {"input_tokens": True},
        [],
        {"input_tokens": 1, "input_tokens_details": 5},
    ],
)
def test_malformed_usage(wire: object) -> None:
    with pytest.raises(ProtocolError, match="^malformed Responses usage$"):
        usage_from_responses(wire)


def test_rate_limits_allow_list() -> None:
    raw = {
        "type": "codex.rate_limits",
        "plan_type": "plus",
        "secret": "x",
        "limit_name": "bad name!",
        "rate_limits": {"primary": {"used_percent": 150, "window_minutes": 300, "extra": 1}},
        "credits": {"has_credits": True, "balance": "12.50", "unlimited": "no"},
    }
    assert sanitize_rate_limits(raw) == {
        "type": "codex.rate_limits",
        "plan_type": "plus",
        "rate_limits": {"primary": {"window_minutes": 300}},
        "credits": {"has_credits": True, "balance": "12.50"},
    }
    assert sanitize_rate_limits({"type": "codex.rate_limits", "junk": 1}) is None


def test_rate_limit_log_drops_consecutive_duplicates_and_is_bounded() -> None:
    log = RateLimitLog()
    ev = {"type": "codex.rate_limits", "plan_type": "plus"}
    assert log.append(ev) and not log.append(dict(ev))
    for i in range(200):
        log.append(
            {"type": "codex.rate_limits", "rate_limits": {"primary": {"used_percent": i % 100}}}
        )
    assert len(log.events) == MAX_EVENTS
