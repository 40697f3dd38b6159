"""The asyncio shell around the Chat Completions recall interceptor (lore-spec C.4).

The follow-up rule is the client's stream flag, passed straight to
``followup.send_follow_up``: a streaming client's follow-up is streamed and
relayed live into the same envelope; a non-streaming client's is ``stream:false``
JSON. Failure semantics match the Anthropic and Responses paths: one recovery
attempt, then 502 "Recall continuation failed" (non-streaming) or an error frame
and no ``[DONE]`` (streaming).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from lore_gateway.errors import error_body
from lore_gateway.obs import metrics
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.handler import (
    _JSON_HEADERS,
    RECALL_FAILED,
    RECALL_INVOKED_HEADER,
    RecallContext,
    RecallFailed,
    StagedRecall,
    _events,
    _final_round_result,
    execute_recall,
    send_counted,
    stream_failure_message,
    stream_follow_up,
    with_keepalive,
)
from lore_gateway.recall.chat.live import (
    ChatRecallStream,
    completion_message,
    completion_recalls,
    follow_up_messages,
    marker_completion,
    sum_chat_usage,
)
from lore_gateway.recall.core import telemetry
from lore_gateway.recall.core.followup import FollowUpError, JSONFollowUp
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.sse import encode_comment
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

_PROTOCOL = "chat"
# An SSE comment: the openai SDK and other Chat clients skip it.
KEEPALIVE = encode_comment("keepalive")


def _recovery(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = messages[-1]
    return [*messages[:-1], {**last, "content": _final_round_result(str(last["content"]))}]


async def stream_recall(ctx: RecallContext, principal: UpstreamResponse, client: Any,
                        response_headers: list[tuple[bytes, bytes]]) -> None:
    """Relay a streamed Chat principal to a streaming client with hidden recalls."""
    stream = ChatRecallStream()
    await client.start(200, response_headers)
    messages = list(ctx.body.get("messages") or [])
    try:
        async for event in _events(principal):
            await client.write(stream.feed(event))
        stream.round.close()
        while stream.round.recalls:
            round_ = stream.round
            executed = await with_keepalive(
                client, execute_recall(ctx, round_.recalls, _PROTOCOL), KEEPALIVE,
                ctx.keepalive_seconds)
            call = round_.recalls[0]
            assistant, tool = follow_up_messages(round_.message(), call, executed.result)
            ctx.staged.append(StagedRecall(executed.anchor_id, executed.marker, call,
                                           executed.result, assistant, tool))
            if executed.marker is not None:
                await client.write(stream.marker_chunk(executed.marker))
            if round_.visible_tool_calls:
                break  # mixed: the client runs its tool; no follow-up
            messages = [*messages, assistant, tool]
            stream.begin_continuation()
            await _stream_follow_up(ctx, stream, client, messages)
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("chat recall stream failed: %s",
                    getattr(exc, "category", type(exc).__name__))
        ctx.staged.clear()
        await client.end(b"data: " + orjson.dumps(
            {"error": {"type": "server_error", "message": stream_failure_message(exc)}})
            + b"\n\n")
        return
    finally:
        principal.close()
    await client.end(stream.finish())
    last = stream.round
    ctx.check_empty(_PROTOCOL, telemetry.chat_message_is_empty(_visible(last.message())),
                    last.model, last.finish_reason, last.usage.get("completion_tokens"))
    ctx.delivered()


def _visible(message: dict[str, Any]) -> dict[str, Any]:
    calls = [c for c in message.get("tool_calls") or []
             if c["function"]["name"] != RECALL_TOOL_NAME]
    return {**message, "tool_calls": calls}


async def _stream_follow_up(ctx: RecallContext, stream: ChatRecallStream, client: Any,
                            messages: list[dict[str, Any]]) -> None:
    answer = await stream_follow_up(ctx, _PROTOCOL, client, messages, _recovery(messages),
                                    KEEPALIVE)
    try:
        async for event in answer.events:
            await client.write(stream.feed(event))
        stream.round.close()
    finally:
        answer.close()


async def buffered_recall(ctx: RecallContext, principal: dict[str, Any]) -> tuple[
        int, bytes, list[tuple[bytes, bytes]]]:
    """The buffered loop for a non-streaming Chat client."""
    try:
        body = await _buffered_loop(ctx, principal)
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("chat buffered recall failed: %s",
                    getattr(exc, "category", type(exc).__name__))
        ctx.staged.clear()
        return 502, error_body("server_error", RECALL_FAILED), _JSON_HEADERS
    headers = _JSON_HEADERS + ([RECALL_INVOKED_HEADER] if ctx.staged else [])
    choice = body["choices"][0]
    ctx.check_empty(_PROTOCOL, telemetry.chat_message_is_empty(_visible(choice["message"])),
                    body.get("model"), choice.get("finish_reason"),
                    (body.get("usage") or {}).get("completion_tokens"))
    return 200, orjson.dumps(body), headers


async def _buffered_loop(ctx: RecallContext, body: dict[str, Any]) -> dict[str, Any]:
    messages = list(ctx.body.get("messages") or [])
    usages = [body.get("usage") or {}]
    delivered = ""
    while True:
        recalls, visible = completion_recalls(body)
        if not recalls:
            break
        executed = await execute_recall(ctx, recalls, _PROTOCOL)
        call = recalls[0]
        assistant, tool = follow_up_messages(completion_message(body), call, executed.result)
        ctx.staged.append(StagedRecall(executed.anchor_id, executed.marker, call,
                                       executed.result, assistant, tool))
        shown = marker_completion(body, executed.marker or "", delivered) \
            if executed.marker else body
        if visible:
            return {**shown, "usage": sum_chat_usage(usages)}
        delivered = str(completion_message(shown).get("content") or "")
        messages = [*messages, assistant, tool]
        body = await _json_follow_up(ctx, messages)
        usages.append(body.get("usage") or {})
    if len(usages) == 1:
        return body
    message = completion_message(body)
    content = delivered + str(message.get("content") or "")
    if not content.strip() and not message.get("tool_calls"):
        raise RecallFailed("follow_up_failed", "recall continuation was not usable")
    choice = {**body["choices"][0], "message": {**message, "content": content}}
    return {**body, "choices": [choice], "usage": sum_chat_usage(usages)}


async def _json_follow_up(ctx: RecallContext, messages: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        answer = await send_counted(ctx, _PROTOCOL, {**ctx.body, "messages": messages},
                                    stream=False)
        assert isinstance(answer, JSONFollowUp)
        completion_message(answer.payload)
        return answer.payload
    except (FollowUpError, ProtocolError) as exc:
        log.warning("recall follow-up failed (%s); trying recovery",
                    getattr(exc, "category", "follow_up_protocol"))
        if not ctx.budget.can_recover():
            raise
    answer = await send_counted(ctx, _PROTOCOL, {**ctx.body, "messages": _recovery(messages)},
                                stream=False)
    assert isinstance(answer, JSONFollowUp)
    if completion_recalls(answer.payload)[0]:
        metrics.record_followup_failure(_PROTOCOL, "follow_up_failed")
        raise RecallFailed("follow_up_failed", "upstream recovery output was unsafe")
    return answer.payload


__all__ = ["buffered_recall", "stream_recall"]
