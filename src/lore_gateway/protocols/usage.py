"""Token usage in one convention, read from and written to each wire format.

The three protocols count cached prompt tokens differently. Anthropic reports
them *beside* ``input_tokens`` (disjoint); OpenAI Responses and Chat report them
*inside* ``input_tokens`` / ``prompt_tokens`` (inclusive). :class:`Usage` is
disjoint (lore-spec I.12): ``input_tokens`` excludes cache reads and writes, so
summing rounds of a recall loop never counts a cached token twice.

Cache fields are ``None`` when the provider did not report them, never ``0``:
a zero we invented would appear on the wire and tell a client something the
provider never said.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lore_gateway.protocols.common import ProtocolError


@dataclass(frozen=True, slots=True)
class Usage:
    """Disjoint token counts. ``total_tokens`` includes every kind."""

    input_tokens: int
    output_tokens: int
    cache_read: int | None = None
    cache_write: int | None = None
    reasoning_tokens: int | None = None

    @property
    def prompt_tokens(self) -> int:
        """Input as OpenAI counts it: cache reads and writes included."""
        return self.input_tokens + (self.cache_read or 0) + (self.cache_write or 0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    def merge(self, other: Usage) -> Usage:
        """The sum of two rounds; an optional field stays None only if both lack it."""
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read=_add_optional(self.cache_read, other.cache_read),
            cache_write=_add_optional(self.cache_write, other.cache_write),
            reasoning_tokens=_add_optional(self.reasoning_tokens, other.reasoning_tokens),
        )


def merge_usage(a: Usage | None, b: Usage | None) -> Usage | None:
    """Sum two possibly-missing usages (a round that reported none adds nothing)."""
    if a is None:
        return b
    if b is None:
        return a
    return a.merge(b)


def _add_optional(a: int | None, b: int | None) -> int | None:
    if a is None and b is None:
        return None
    return (a or 0) + (b or 0)


def _count(obj: dict[str, Any], key: str, error: str, *, required: bool = False) -> int | None:
    """A non-negative integer field; None when absent or null (unless required)."""
    value = obj.get(key)
    if value is None:
        if required:
            raise ProtocolError(error)
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(error)
    return value


def _details(obj: dict[str, Any], key: str, error: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(error)
    return value


def _disjoint_input(prompt: int, cache_read: int | None, cache_write: int | None) -> int:
    return max(0, prompt - (cache_read or 0) - (cache_write or 0))


# --- OpenAI Responses -----------------------------------------------------------------

RESPONSES_USAGE_ERROR = "malformed Responses usage"


def usage_from_responses(wire: object) -> Usage:
    """Read a Responses ``usage`` object (inclusive ``input_tokens``).

    ``cache_write_tokens`` is not in OpenAI's schema but GitHub Copilot's and
    OpenRouter's Responses endpoints send it inside ``input_tokens_details``.
    """
    err = RESPONSES_USAGE_ERROR
    if not isinstance(wire, dict):
        raise ProtocolError(err)
    prompt = _count(wire, "input_tokens", err) or 0
    output = _count(wire, "output_tokens", err) or 0
    inp = _details(wire, "input_tokens_details", err)
    out = _details(wire, "output_tokens_details", err)
    cache_read = _count(inp, "cached_tokens", err)
    cache_write = _count(inp, "cache_write_tokens", err)
    if cache_write is None:
        cache_write = _count(wire, "cache_write_tokens", err)
    return Usage(
        input_tokens=_disjoint_input(prompt, cache_read, cache_write),
        output_tokens=output,
        cache_read=cache_read,
        cache_write=cache_write,
        reasoning_tokens=_count(out, "reasoning_tokens", err),
    )


def usage_to_responses(usage: Usage) -> dict[str, Any]:
    """Render as Responses wire usage. The detail objects are always present
    because the openai SDK's ``ResponseUsage`` model declares them."""
    input_details: dict[str, Any] = {"cached_tokens": usage.cache_read or 0}
    if usage.cache_write is not None:
        input_details["cache_write_tokens"] = usage.cache_write
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": input_details,
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.total_tokens,
    }


# --- Anthropic Messages ---------------------------------------------------------------

ANTHROPIC_USAGE_ERROR = "malformed Anthropic usage"


def usage_from_anthropic(wire: object) -> Usage:
    """Read an Anthropic ``usage`` object (already disjoint)."""
    err = ANTHROPIC_USAGE_ERROR
    if not isinstance(wire, dict):
        raise ProtocolError(err)
    return Usage(
        input_tokens=_count(wire, "input_tokens", err) or 0,
        output_tokens=_count(wire, "output_tokens", err) or 0,
        cache_read=_count(wire, "cache_read_input_tokens", err),
        cache_write=_count(wire, "cache_creation_input_tokens", err),
    )


def usage_to_anthropic(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {"input_tokens": usage.input_tokens}
    if usage.cache_write is not None:
        out["cache_creation_input_tokens"] = usage.cache_write
    if usage.cache_read is not None:
        out["cache_read_input_tokens"] = usage.cache_read
    out["output_tokens"] = usage.output_tokens
    return out


# --- OpenAI Chat Completions ----------------------------------------------------------

CHAT_USAGE_ERROR = "malformed OpenAI usage"


def usage_from_chat(wire: object) -> Usage:
    """Read a Chat ``usage`` object (inclusive ``prompt_tokens``).

    OpenRouter reports cache creation as ``prompt_tokens_details.cache_write_tokens``.
    """
    err = CHAT_USAGE_ERROR
    if not isinstance(wire, dict):
        raise ProtocolError(err)
    prompt = _count(wire, "prompt_tokens", err) or 0
    inp = _details(wire, "prompt_tokens_details", err)
    out = _details(wire, "completion_tokens_details", err)
    cache_read = _count(inp, "cached_tokens", err)
    cache_write = _count(inp, "cache_write_tokens", err)
    return Usage(
        input_tokens=_disjoint_input(prompt, cache_read, cache_write),
        output_tokens=_count(wire, "completion_tokens", err) or 0,
        cache_read=cache_read,
        cache_write=cache_write,
        reasoning_tokens=_count(out, "reasoning_tokens", err),
    )


def usage_to_chat(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cache_read is not None or usage.cache_write is not None:
        details: dict[str, Any] = {"cached_tokens": usage.cache_read or 0}
        if usage.cache_write is not None:
            details["cache_write_tokens"] = usage.cache_write
        out["prompt_tokens_details"] = details
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out
