"""Anthropic Messages on the recall chain (lore-spec C.2, C.3): the two adapters
the core drivers (:mod:`~lore_gateway.recall.core.driver`) run, and the entry
points the service calls.

The follow-up goes through ``followup.send_follow_up`` with the client's own
stream flag: a streaming client gets a streamed follow-up relayed live through
:class:`AnthropicRecallStream`, a non-streaming client a ``stream:false``
follow-up read as JSON.

Failure semantics (shared with the Responses path): a failed follow-up gets one
recovery attempt (the same request with the final-round instruction, so the
model answers without recalling again); if that fails too, a non-streaming
client gets 502 "Recall continuation failed" and a streaming client an
Anthropic ``error`` event, never a success terminal. Staged recalls are handed
to ``on_delivered`` only after the client received the whole response.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.usage import usage_from_anthropic
from lore_gateway.recall.anthropic.live import AnthropicRecallStream, content_usable, sum_usage
from lore_gateway.recall.core import driver, telemetry
from lore_gateway.recall.core.chain import (
    ExecutedRecall,
    RecallCall,
    RecallContext,
    final_round_result,
    stream_failure_message,
)
from lore_gateway.recall.core.machine import Round
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import encode_event
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

_PROTOCOL = "anthropic"
# Anthropic's own keepalive: clients already ignore it between any two events.
PING = encode_event("ping", b'{"type": "ping"}')


# --- Anthropic message shapes --------------------------------------------------


def follow_up_pair(content: list[dict[str, Any]], call: RecallCall,
                   result: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The assistant message (every block the model produced up to and including
    the recall, thinking and redacted thinking replayed as required when
    extended thinking is on) and the user message with the tool_result."""
    blocks = [b for i, b in enumerate(content) if i <= call.position]
    assistant = {"role": "assistant", "content": blocks}
    tool_result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.tool_use_id, "content": result}]}
    return assistant, tool_result


def message_recalls(message: dict[str, Any]) -> tuple[list[RecallCall], int]:
    """Recall tool_use blocks of a non-stream message, and the visible tool count."""
    recalls: list[RecallCall] = []
    visible = 0
    for position, block in enumerate(message.get("content") or []):
        if isinstance(block, dict) and block.get("type") == "tool_use":
            if block.get("name") == RECALL_TOOL_NAME:
                recalls.append(RecallCall(str(block.get("id", "")),
                                          orjson.dumps(block.get("input") or {}).decode(),
                                          position))
            else:
                visible += 1
    return recalls, visible


def check_message(payload: dict[str, Any]) -> dict[str, Any]:
    if payload.get("type") != "message" or not isinstance(payload.get("content"), list):
        raise ProtocolError("upstream Anthropic request did not complete")
    if payload.get("stop_reason") not in ("end_turn", "tool_use", "stop_sequence", "refusal"):
        raise ProtocolError("upstream Anthropic request did not complete")
    return payload


def recovery_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The follow-up once more, telling the model to answer without recall."""
    tool_result = messages[-1]
    block = tool_result["content"][0]
    recovered = {**tool_result, "content": [
        {**block, "content": final_round_result(str(block["content"]))}]}
    return [*messages[:-1], recovered]


def _visible_empty(content: list[dict[str, Any]]) -> bool:
    shown = [b for b in content
             if not (b.get("type") == "tool_use" and b.get("name") == RECALL_TOOL_NAME)]
    return telemetry.anthropic_content_is_empty(shown)


# --- streaming client ---------------------------------------------------------------


class StreamAdapter(driver.MessagesStream):
    """An Anthropic client's live stream on the chain."""

    label, keepalive, recovery = _PROTOCOL, PING, staticmethod(recovery_messages)

    def __init__(self, ctx: RecallContext) -> None:
        self.stream = AnthropicRecallStream(max_state_bytes=ctx.retained_bytes)
        super().__init__(ctx, self.stream)

    def recalled(self, executed: ExecutedRecall, *, mixed: bool) -> tuple[
            bytes, dict[str, Any], dict[str, Any]]:
        rnd = self.stream.round
        assistant, tool_result = follow_up_pair(rnd.acc.content(), rnd.recalls[0], executed.result)
        if mixed:
            # The client runs its own tool; the recall is replayed next turn.
            shown = self.stream.inline_marker(executed.marker) if executed.marker else b""
            return shown, assistant, tool_result
        shown = self.stream.close_preamble()
        if executed.marker is not None:
            shown += self.stream.marker_message(executed.marker)
        self.messages = [*self.messages, assistant, tool_result]
        self.stream.begin_continuation()
        return shown, assistant, tool_result

    def error_frame(self, message: str) -> bytes:
        return encode_event("error", orjson.dumps(
            {"type": "error", "error": {"type": "api_error", "message": message}}))

    def report_empty(self, ctx: RecallContext) -> None:
        # The round's read-outs, not the Message body: telemetry needs four of
        # its fields, not the body's copies nor its usage's checks.
        last = self.stream.round.acc
        ctx.check_empty(_PROTOCOL, _visible_empty(last.content()), last.message.get("model"),
                        last.stop_reason, last.usage.get("output_tokens"))


async def stream_recall(ctx: RecallContext, principal: UpstreamResponse,
                        client: driver.ClientStream,
                        response_headers: list[tuple[bytes, bytes]]) -> driver.OneRound | None:
    """Relay a streamed Anthropic principal to a streaming Anthropic client,
    running hidden recalls and splicing in their continuations; the answer's
    usage when it went out in one round as it came (else None)."""
    adapter = StreamAdapter(ctx)
    if not await driver.serve_stream(ctx, adapter, principal, client, response_headers):
        return None
    rounds = adapter.stream.rounds
    if len(rounds) > 1 or rounds[0].recall_seen or rounds[0].error is not None:
        return None
    # message_start's usage with every message_delta's laid over it.
    usage = rounds[0].acc.usage
    return driver.OneRound(usage_from_anthropic(usage) if usage else None)


# --- non-streaming client -------------------------------------------------------------


class BufferedAdapter(driver.MessagesFollowUps):
    """A non-streaming Anthropic client's whole answers on the chain."""

    label, strict_frames, recovery = _PROTOCOL, False, staticmethod(recovery_messages)

    def __init__(self, ctx: RecallContext) -> None:
        self.messages: list[dict[str, Any]] = list(ctx.body.get("messages") or [])
        self.shown: list[dict[str, Any]] = []  # blocks the client gets from earlier rounds
        self.usages: list[dict[str, Any]] = []
        self.message: dict[str, Any] = {}
        self.recalls: list[RecallCall] = []

    def round(self, answer: dict[str, Any]) -> Round:
        self.message = check_message(answer)
        self.usages.append(self.message.get("usage") or {})
        self.recalls, visible = message_recalls(self.message)
        return Round(len(self.recalls), visible,
                     content_usable(self.message.get("stop_reason"), self.message["content"]))

    def call(self) -> RecallCall:
        return self.recalls[0]

    def recalled(self, executed: ExecutedRecall) -> tuple[dict[str, Any], dict[str, Any]]:
        call, content = self.recalls[0], self.message["content"]
        assistant, tool_result = follow_up_pair(content, call, executed.result)
        shown = [b for i, b in enumerate(content) if i != call.position]
        if executed.marker is not None:
            shown.insert(call.position, {"type": "text", "text": executed.marker})
        self.shown += shown
        self.messages = [*self.messages, assistant, tool_result]
        return assistant, tool_result

    def delivered(self, answer: dict[str, Any], *, mixed: bool) -> dict[str, Any]:
        message = self.message
        content = self.shown if mixed else self.shown + message["content"]
        usage = dict(message.get("usage") or {})
        usage.update(sum_usage(self.usages))
        return {**message, "content": content, "usage": usage}

    def report_empty(self, ctx: RecallContext, body: dict[str, Any]) -> None:
        usage = body.get("usage") or {}
        ctx.check_empty(_PROTOCOL, _visible_empty(body["content"]), body.get("model"),
                        body.get("stop_reason"), usage.get("output_tokens"))


async def buffered_recall(ctx: RecallContext, principal: dict[str, Any]) -> tuple[
        int, bytes, list[tuple[bytes, bytes]]]:
    """The buffered loop (C.3) for a non-streaming Anthropic client. Returns the
    status, body and extra headers the client gets."""
    return await driver.serve_json(ctx, BufferedAdapter(ctx), principal)


__all__ = [
    "BufferedAdapter",
    "StreamAdapter",
    "buffered_recall",
    "stream_failure_message",
    "stream_recall",
]
