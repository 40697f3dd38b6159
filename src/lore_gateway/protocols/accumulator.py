"""What every wire protocol's stream accumulator offers (sans-IO).

One accumulator per protocol (``AnthropicAccumulator``, ``ChatAccumulator``,
``ResponsesAccumulator``) applies a stream's events into the complete
response, with one set of rules: storage (``collector.TurnCollector``) and the
live recall rounds (``recall/anthropic/live.py``, ``recall/chat/live.py``,
``recall/responses``) drive the same class, so an event is read the same way
whether the gateway stores it or acts on it. Like h11, an accumulator raises
``ProtocolError`` with the exact message and is then unusable; it never limps on.

The messages protocols also take the leading frames of a raw read in one go
(``take``): their live rounds relay most reads as they came, and decoding each
text delta into an event object was most of a stream's CPU. Every fast path is
behind ``feed_event`` or ``take`` and ends in the same state as the general
path, by test (tests/recall/test_messages_fast_reads.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from lore_gateway.protocols.common import ProtocolError, ToolCall
from lore_gateway.protocols.usage import Usage
from lore_gateway.sse import SSEEvent


class StateLimitExceeded(ProtocolError):
    """A bound on what the gateway retains was hit; the message names the limit,
    so the client's error says which one (not a generic recall failure)."""


class StreamResult(Protocol):
    """The read-outs every protocol's result has (each adds its own)."""

    @property
    def id(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def usage(self) -> Usage | None: ...

    @property
    def text(self) -> str: ...

    @property
    def tool_calls(self) -> list[ToolCall]: ...


class StreamAccumulator(Protocol):
    """One stream, accumulated: events in, the complete response out."""

    error_event: dict[str, Any] | None  # an upstream error event, as it came

    @property
    def done(self) -> bool:
        """The stream's terminal was applied."""

    def feed_event(self, event: SSEEvent) -> None:
        """Apply one decoded SSE frame (``ProtocolError`` on a broken stream)."""

    def close(self) -> None:
        """The stream ended; ``ProtocolError`` unless its terminal came."""

    def result(self) -> StreamResult:
        """The response accumulated so far (complete once :attr:`done`)."""

    def response_body(self) -> dict[str, Any]:
        """The non-stream body a client would have received."""


class ReadAccumulator(StreamAccumulator, Protocol):
    """A messages protocol's accumulator, which also takes raw reads."""

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """Apply the frames at the start of ``data`` its fast paths accept, at
        most ``max_frames``: how many bytes and frames that was (0, 0: none;
        the caller decodes the rest)."""
