"""Whether what a client got ends with its stream's terminal frame
(``collector.ends_with_terminal``): the proxy lets a relay finish when a client
leaves after it, and cuts it at once otherwise."""

from __future__ import annotations

import pytest

from lore_gateway.collector import ends_with_terminal, terminal_marks
from lore_gateway.routing import Protocol

RESPONSES = terminal_marks(Protocol.RESPONSES, recall=False)
CHAT = terminal_marks(Protocol.CHAT, recall=False)
ANTHROPIC = terminal_marks(Protocol.ANTHROPIC, recall=False)
DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'


@pytest.mark.parametrize(("sent", "marks", "whole"), [
    (DELTA + b'event: response.completed\ndata: {"type":"response.completed",'
     b'"response":{"status":"completed"}}\n\n', RESPONSES, True),
    (b'event: response.incomplete\ndata: {"type":"response.incomplete"}\n\n', RESPONSES, True),
    (DELTA, RESPONSES, False),
    # The text of a delta quoting a terminal event has its quotes escaped.
    (b'data: {"type":"response.output_text.delta","delta":"\\"type\\":'
     b'\\"response.completed\\""}\n\n', RESPONSES, False),
    (b'data: {"choices":[]}\n\ndata: [DONE]\n\n', CHAT, True),
    (b"data: [DONE]\n\n", CHAT, True),  # the chunk that holds the terminal alone
    (b'data: {"choices":[{"delta":{"content":"data: [DONE]"}}]}\n\n', CHAT, False),
    (b'event: message_stop\ndata: {"type":"message_stop"}\n\n', ANTHROPIC, True),
    # A message_stop with a message begun after it: not the end of the stream.
    (b'event: message_stop\ndata: {"type":"message_stop"}\n\nevent: message_start\n'
     b'data: {"type":"message_start"}\n\n', ANTHROPIC, False),
])
def test_the_last_frame_decides(sent: bytes, marks: tuple[bytes, ...], whole: bool) -> None:
    assert ends_with_terminal(sent, marks) is whole


def test_no_marks_where_a_message_stop_is_not_the_end() -> None:
    """The gateway's own Anthropic recall stream holds three messages; Gemini's
    stream has no terminal frame at all."""
    assert terminal_marks(Protocol.ANTHROPIC, recall=True) == ()
    assert terminal_marks(Protocol.GEMINI, recall=False) == ()
    assert terminal_marks(Protocol.RESPONSES, recall=True) == RESPONSES
