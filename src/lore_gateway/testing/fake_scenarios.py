"""The fake upstream's scenarios: their names and the well-formed answer each is
built on (misbehaviours bend it later, in ``fake_upstream``).

Scenarios (``name`` or ``name:argument``; see docs/testing.md):

``text[:words]``          a complete answer (the default)
``blank``                 a complete answer whose text is only whitespace
``recall[:query]``        a call to the ``recall`` tool; once the request ends
                          with the tool's output, text quoting its top result
``call-recall[:query]``   a recall call even after a tool output (chains recalls)
``thinking-call-recall[:q]`` Anthropic: the same, opened by a signed thinking block
``thinking-recall[:q]``   Anthropic: a signed thinking block, text, then recall
``recall-first[:query]``  Anthropic: recall as the message's first block
``recall-between[:q]``    a visible ``read_file`` call, recall, another ``read_file``
``parallel-recall[:q]``   Responses: two recall calls in one response
``text-recall[:q]``       Responses: a short message, then a recall call
``failed`` ``incomplete`` ``minimal`` ``no-completed``
``status-<code>``         that HTTP status with the provider's error body and
                          rate-limit / retry-after / request-id headers
``reset-mid-stream[:n]``  n frames, then a TCP reset (at an event boundary)
``reset-mid-event[:n]``   n frames and half of the next, then a TCP reset
``malformed-event``       one frame with invalid JSON in the middle
``stall[:seconds]``       3 frames, then silence (until the client leaves if
                          no seconds are given); the disconnect is recorded
``linger[:seconds]``      every frame, terminal event included, then silence
                          before the end of the body (the same way)
``missing-terminal``      the stream ends cleanly without its terminal event
``big-stream:<MiB>[@<n>]`` that many MiB of text deltas of n bytes (default
                          4096), generated on the fly
``slow:<seconds>``        wait that long before the response headers, then text
``too-long``              400 context overflow ("prompt is too long" /
                          "context_length_exceeded"), as the providers word it
``tool:<name> <json>``    a call to the client's own tool ``name`` with those
                          arguments (script the answer that follows its output)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_recall import ALWAYS_CALL, RECALL_SCENARIOS, recall_call
from lore_gateway.testing.fake_streams import Answer
from lore_gateway.testing.fake_wire import error_body, model_of, recall_answer_text, tool_output

BLANK_TEXT = " \n\t "


@dataclass(frozen=True)
class Scenario:
    name: str
    arg: str | None

    @classmethod
    def parse(cls, spec: str) -> Scenario:
        name, _, arg = spec.strip().partition(":")
        return cls(name.strip().lower(), arg.strip() or None)


def canned(shape: str, scenario: Scenario, body: dict[str, Any], default_text: str,
       deltas: int | None) -> Answer:
    """The well-formed answer a scenario is built on (misbehaviours bend it later)."""
    chat_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    api = "chat" if shape == "chat" else "anthropic" if shape == "anthropic" else "responses"
    model = model_of(body, "claude-fake" if api == "anthropic" else "gpt-fake")
    name = scenario.name
    text = default_text
    if name == "text" and scenario.arg:
        text = scenario.arg
    if name == "blank":
        text = BLANK_TEXT
    if name == "tool" and scenario.arg:
        tool_name, _, arguments = scenario.arg.partition(" ")
        if api == "anthropic":
            return fs.anthropic_call(tool_name, arguments or "{}", model)
        if api == "responses":
            return fs.responses_call(tool_name, arguments or "{}", model)
        return fs.chat_call(tool_name, arguments or "{}", model, chat_usage)
    if name in RECALL_SCENARIOS:
        output = tool_output(api, body)
        if output is None or name in ALWAYS_CALL:
            query = scenario.arg or fs.DEFAULT_RECALL_QUERY
            return recall_call(api, name, orjson.dumps({"query": query}).decode(),
                                model, chat_usage)
        text = recall_answer_text(output)
    if name == "failed" and api == "responses":
        return fs.responses_failed(model)
    if name == "failed":
        frames = fs.chat_error_frames() if api == "chat" else fs.anthropic_error_frames()
        return Answer(frames, error_body(api, 500, "fake failure"))
    if name == "incomplete":
        if api == "chat":
            return fs.chat_text(text, model, chat_usage, "length")
        if api == "anthropic":
            return fs.anthropic_text(text, model, "max_tokens")
        return fs.responses_incomplete(text, model)
    if name == "minimal":
        if api == "chat":
            return fs.chat_text(text, model, chat_usage, deltas=1)
        if api == "anthropic":
            return fs.anthropic_minimal(text, model)
        return fs.responses_minimal(text, model)
    if api == "chat":
        return fs.chat_text(text, model, chat_usage, deltas=deltas)
    if api == "anthropic":
        return fs.anthropic_text(text, model, deltas=deltas)
    return fs.responses_text(text, model, deltas)
