"""Chat Completions on the recall chain (lore-spec C.4): the two adapters the core
drivers (:mod:`~lore_gateway.recall.core.driver`) run, and the entry points the
service calls.

The follow-up rule is the client's stream flag, passed straight to
``followup.send_follow_up``: a streaming client's follow-up is streamed and
relayed live into the same envelope; a non-streaming client's is ``stream:false``
JSON. Failure semantics are the chain machine's: one recovery attempt, then 502
"Recall continuation failed" (non-streaming) or an error frame and no ``[DONE]``
(streaming).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from lore_gateway.protocols.usage import usage_from_chat
from lore_gateway.recall.chat.live import (
    ChatRecallStream,
    completion_message,
    completion_recalls,
    follow_up_messages,
    marker_completion,
    message_usable,
    sum_chat_usage,
)
from lore_gateway.recall.core import driver, telemetry
from lore_gateway.recall.core.chain import (
    ExecutedRecall,
    RecallCall,
    RecallContext,
    final_round_result,
)
from lore_gateway.recall.core.machine import Round
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import encode_comment
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

_PROTOCOL = "chat"
# An SSE comment: the openai SDK and other Chat clients skip it.
KEEPALIVE = encode_comment("keepalive")


def recovery_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The follow-up once more, telling the model to answer without recall."""
    last = messages[-1]
    return [*messages[:-1], {**last, "content": final_round_result(str(last["content"]))}]


def _visible(message: dict[str, Any]) -> dict[str, Any]:
    calls = [c for c in message.get("tool_calls") or []
             if c["function"]["name"] != RECALL_TOOL_NAME]
    return {**message, "tool_calls": calls}


# --- streaming client ---------------------------------------------------------------


class StreamAdapter(driver.MessagesStream):
    """A Chat client's live stream on the chain: one envelope throughout."""

    label, keepalive, recovery = _PROTOCOL, KEEPALIVE, staticmethod(recovery_messages)

    def __init__(self, ctx: RecallContext) -> None:
        self.stream = ChatRecallStream(max_state_bytes=ctx.retained_bytes)
        super().__init__(ctx, self.stream)

    def recalled(self, executed: ExecutedRecall, *, mixed: bool) -> tuple[
            bytes, dict[str, Any], dict[str, Any]]:
        rnd = self.stream.round
        assistant, tool = follow_up_messages(rnd.acc.message(), rnd.recalls[0], executed.result)
        shown = self.stream.marker_chunk(executed.marker) if executed.marker else b""
        if not mixed:
            self.messages = [*self.messages, assistant, tool]
            self.stream.begin_continuation()
        return shown, assistant, tool

    def error_frame(self, message: str) -> bytes:
        return b"data: " + orjson.dumps(
            {"error": {"type": "server_error", "message": message}}) + b"\n\n"

    def report_empty(self, ctx: RecallContext) -> None:
        last = self.stream.round.acc
        ctx.check_empty(_PROTOCOL, telemetry.chat_message_is_empty(_visible(last.message())),
                        last.head("model"), last.finish_reason,
                        last.usage.get("completion_tokens"))


async def stream_recall(ctx: RecallContext, principal: UpstreamResponse,
                        client: driver.ClientStream,
                        response_headers: list[tuple[bytes, bytes]]) -> driver.OneRound | None:
    """Relay a streamed Chat principal to a streaming client with hidden recalls;
    the answer's usage when it went out in one round as it came (else None)."""
    adapter = StreamAdapter(ctx)
    if not await driver.serve_stream(ctx, adapter, principal, client, response_headers):
        return None
    rounds = adapter.stream.rounds
    if len(rounds) > 1 or rounds[0].recall_seen:
        return None
    # The last usage that is not null, as a reader of the client's bytes takes it.
    wire = rounds[0].acc.wire_usage
    return driver.OneRound(None if wire is None else usage_from_chat(wire))


# --- non-streaming client -------------------------------------------------------------


class BufferedAdapter(driver.MessagesFollowUps):
    """A non-streaming Chat client's whole answers on the chain."""

    label, strict_frames, recovery = _PROTOCOL, False, staticmethod(recovery_messages)

    def __init__(self, ctx: RecallContext) -> None:
        self.messages: list[dict[str, Any]] = list(ctx.body.get("messages") or [])
        self.usages: list[dict[str, Any]] = []
        self.prefix = ""  # content the client gets from earlier rounds
        self.body: dict[str, Any] = {}
        self.shown: dict[str, Any] = {}
        self.recalls: list[RecallCall] = []

    def round(self, answer: dict[str, Any]) -> Round:
        self.recalls, visible = completion_recalls(answer)  # validates the body
        self.body = answer
        self.usages.append(answer.get("usage") or {})
        return Round(len(self.recalls), visible, message_usable(completion_message(answer)))

    def call(self) -> RecallCall:
        return self.recalls[0]

    def recalled(self, executed: ExecutedRecall) -> tuple[dict[str, Any], dict[str, Any]]:
        assistant, tool = follow_up_messages(completion_message(self.body), self.recalls[0],
                                             executed.result)
        self.shown = marker_completion(self.body, executed.marker or "", self.prefix)
        self.prefix = str(completion_message(self.shown).get("content") or "")
        self.messages = [*self.messages, assistant, tool]
        return assistant, tool

    def delivered(self, answer: dict[str, Any], *, mixed: bool) -> dict[str, Any]:
        if mixed:
            return {**self.shown, "usage": sum_chat_usage(self.usages)}
        if len(self.usages) == 1:
            return answer  # no recall: the upstream's body as it came
        message = completion_message(answer)
        content = self.prefix + str(message.get("content") or "")
        choice = {**answer["choices"][0], "message": {**message, "content": content}}
        return {**answer, "choices": [choice], "usage": sum_chat_usage(self.usages)}

    def report_empty(self, ctx: RecallContext, body: dict[str, Any]) -> None:
        choice = body["choices"][0]
        ctx.check_empty(_PROTOCOL, telemetry.chat_message_is_empty(_visible(choice["message"])),
                        body.get("model"), choice.get("finish_reason"),
                        (body.get("usage") or {}).get("completion_tokens"))


async def buffered_recall(ctx: RecallContext, principal: dict[str, Any]) -> tuple[
        int, bytes, list[tuple[bytes, bytes]]]:
    """The buffered loop for a non-streaming Chat client."""
    return await driver.serve_json(ctx, BufferedAdapter(ctx), principal)


__all__ = ["BufferedAdapter", "StreamAdapter", "buffered_recall", "stream_recall"]
