"""The asyncio shell around the Anthropic recall interceptor (lore-spec C.2, C.3).

It reads the upstream, writes what :class:`AnthropicRecallStream` says, runs the
recall, and sends the follow-up through ``followup.send_follow_up`` with the
client's own stream flag: a streaming client gets a streamed follow-up relayed
live, a non-streaming client a ``stream:false`` follow-up read as JSON.

Failure semantics (shared with the Responses path): a failed follow-up gets one
recovery attempt (the same request with the final-round instruction, so the
model answers without recalling again); if that fails too, a non-streaming
client gets 502 "Recall continuation failed" and a streaming client an
Anthropic ``error`` event, never a success terminal. Staged recalls are handed
to ``on_delivered`` only after the client received the whole response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from lore_gateway.errors import error_body
from lore_gateway.obs import metrics
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.anthropic.live import (
    AnthropicRecallStream,
    RecallCall,
    StateLimitExceeded,
    sum_usage,
)
from lore_gateway.recall.core import telemetry
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT, RecallChainBudget
from lore_gateway.recall.core.executor import RecallExecutor
from lore_gateway.recall.core.followup import (
    FollowUpError,
    JSONFollowUp,
    StreamedFollowUp,
    send_follow_up,
)
from lore_gateway.recall.core.markers import anchored_marker, new_anchor_id, visible_marker
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME, RecallArgumentError, parse_arguments
from lore_gateway.sse import SSEDecoder, SSEEvent, encode_event
from lore_gateway.upstream import UpstreamClient, UpstreamResponse

log = logging.getLogger("lore.recall")

_PROTOCOL = "anthropic"
RECALL_FAILED = "Recall continuation failed"
STREAM_RECALL_FAILED = "Lore could not continue the response after recall"
RECALL_INVOKED_HEADER = (b"x-lore-recall-invoked", b"true")
# A non-stream answer larger than this is not a plausible single message.
MAX_JSON_BYTES = 4 * 1024 * 1024
_JSON_HEADERS = [(b"content-type", b"application/json")]
# Bun's fetch (Claude Code) gives up after about five minutes of silence and some
# agents sooner; the reference writes a keepalive after 30 s without output.
DEFAULT_KEEPALIVE_SECONDS = 30.0
# Anthropic's own keepalive: clients already ignore it between any two events.
PING = encode_event("ping", b'{"type": "ping"}')

T = TypeVar("T")


class RecallFailed(Exception):
    """The recall chain cannot deliver an answer. ``category`` is the C.7 code."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


@dataclass(frozen=True, slots=True)
class StagedRecall:
    """A recall that ran, to be stored for expansion once the client got the answer.

    ``assistant`` and ``tool_result`` are the exact two messages the follow-up
    appended, so expansion can restore upstream history byte for byte.
    """

    anchor_id: str | None
    marker: str | None
    call: RecallCall
    result: str
    assistant: dict[str, Any]
    tool_result: dict[str, Any]


@dataclass(slots=True)
class RecallContext:
    """Everything one client request's recall chain needs."""

    upstream: UpstreamClient
    url: str
    headers: list[tuple[str, str]]
    body: dict[str, Any]  # the upstream request that produced the principal
    executor: RecallExecutor
    budget: RecallChainBudget
    on_delivered: Callable[[list[StagedRecall]], None] | None = None
    staged: list[StagedRecall] = field(default_factory=list)
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS
    session: str = ""  # for telemetry only

    def check_empty(self, protocol: str, empty: bool, model: Any, stop_reason: Any,
                    output_tokens: Any) -> None:
        """Empty-completion telemetry for the answer the client got (never raises)."""
        if empty:
            telemetry.report_empty_completion(telemetry.EmptyCompletion(
                protocol=protocol, model=str(model or "unknown"), session=self.session,
                stop_reason=str(stop_reason or "unknown"),
                output_tokens=output_tokens if isinstance(output_tokens, int) else None,
                recall_depth=len(self.staged)))

    def delivered(self) -> None:
        if self.on_delivered is not None and self.staged:
            self.on_delivered(list(self.staged))


@dataclass(frozen=True, slots=True)
class ExecutedRecall:
    result: str  # what the model reads (budget guidance included)
    marker: str | None  # None for an invalid call: nothing visible, nothing stored
    anchor_id: str | None


async def execute_recall(ctx: RecallContext, recalls: list[RecallCall],
                         protocol: str) -> ExecutedRecall:
    """Admit, run and account one recall; the shared step of every protocol."""
    if len(recalls) > 1:
        metrics.record_followup_failure(protocol, "parallel_recall")
        raise RecallFailed("parallel_recall", "more than one recall call in one response")
    (call,) = recalls
    try:
        args = parse_arguments(_decoded(call.arguments))
    except RecallArgumentError as exc:
        return ExecutedRecall(exc.tool_result(), None, None)
    refused = ctx.budget.admit(args)
    if refused is not None:
        metrics.record_followup_failure(protocol, "depth_exhausted")
        raise RecallFailed("depth_exhausted", f"recall budget refused: {refused}")
    started = time.monotonic()
    outcome = await ctx.executor.run(args)
    metrics.record_recall(protocol, len(outcome.coverage), time.monotonic() - started,
                          ok=not outcome.failed)
    ctx.budget.record(outcome.text, outcome.coverage)
    anchor = new_anchor_id()
    return ExecutedRecall(ctx.budget.result_for_model(outcome.text),
                          anchored_marker(visible_marker(args), anchor), anchor)


async def send_counted(ctx: RecallContext, protocol: str, body: dict[str, Any], *,
                       stream: bool) -> StreamedFollowUp | JSONFollowUp:
    """``send_follow_up`` with the follow-up metrics: one count per request sent,
    one failure count (by C.7 category) per request that did not answer."""
    metrics.record_followup(protocol)
    try:
        return await send_follow_up(ctx.upstream, ctx.url, ctx.headers, body, stream=stream)
    except FollowUpError as exc:
        metrics.record_followup_failure(protocol, exc.category)
        raise


async def stream_follow_up(ctx: RecallContext, protocol: str, client: Any,
                           messages: list[dict[str, Any]], recovery: list[dict[str, Any]],
                           keepalive: bytes) -> StreamedFollowUp:
    """The streamed follow-up, with keepalives while it starts, and one recovery
    request (``recovery`` messages) when it fails and the budget allows one."""
    every = ctx.keepalive_seconds
    try:
        answer = await with_keepalive(client, send_counted(
            ctx, protocol, {**ctx.body, "messages": messages}, stream=True), keepalive, every)
    except FollowUpError as exc:
        log.warning("recall follow-up failed (%s); trying recovery", exc.category)
        if not ctx.budget.can_recover():
            raise
        answer = await with_keepalive(client, send_counted(
            ctx, protocol, {**ctx.body, "messages": recovery}, stream=True), keepalive, every)
    assert isinstance(answer, StreamedFollowUp)
    return answer


async def with_keepalive(client: Any, work: Awaitable[T], frame: bytes, every: float) -> T:
    """Await ``work`` while writing ``frame`` to the client every ``every`` seconds,
    so a recall and a slow follow-up do not look like a dead connection."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            await client.write(frame)

    beater = asyncio.create_task(beat())
    try:
        return await work
    finally:
        beater.cancel()


def _decoded(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise RecallArgumentError("expected_object", "recall arguments are not JSON") from None


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


def _final_round_result(result: str) -> str:
    return result if FINAL_ROUND_TEXT in result else f"{result}\n\n{FINAL_ROUND_TEXT}"


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


def _check_message(payload: dict[str, Any]) -> dict[str, Any]:
    if payload.get("type") != "message" or not isinstance(payload.get("content"), list):
        raise ProtocolError("upstream Anthropic request did not complete")
    if payload.get("stop_reason") not in ("end_turn", "tool_use", "stop_sequence", "refusal"):
        raise ProtocolError("upstream Anthropic request did not complete")
    return payload


def _usable(message: dict[str, Any]) -> bool:
    """C.1 "usable continuation": some text or a tool call, and not cut short."""
    if message.get("stop_reason") in ("max_tokens", "pause_turn",
                                      "model_context_window_exceeded"):
        return False
    for block in message.get("content") or []:
        if block.get("type") == "tool_use":
            return True
        if block.get("type") == "text" and str(block.get("text", "")).strip():
            return True
    return False


# --- streaming client ---------------------------------------------------------------


async def _events(resp: UpstreamResponse) -> AsyncIterator[SSEEvent]:
    decoder = SSEDecoder()
    async for chunk in resp.chunks():
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.close():
        yield event


def stream_failure_message(exc: Exception) -> str:
    """What a streaming client is told: a hit limit by name, else the generic line."""
    if isinstance(exc, StateLimitExceeded):
        return f"Lore stopped the response: {exc}; raise LORE_RECALL_RETAINED_MAX_BYTES"
    return STREAM_RECALL_FAILED


def _stream_error(message: str) -> bytes:
    return encode_event("error", orjson.dumps(
        {"type": "error", "error": {"type": "api_error", "message": message}}))


async def stream_recall(ctx: RecallContext, principal: UpstreamResponse, client: Any,
                        response_headers: list[tuple[bytes, bytes]]) -> None:
    """Relay a streamed Anthropic principal to a streaming Anthropic client,
    running hidden recalls and splicing in their continuations."""
    stream = AnthropicRecallStream()
    await client.start(200, response_headers)
    messages: list[dict[str, Any]] | None = list(ctx.body.get("messages") or [])
    try:
        async for event in _events(principal):
            await client.write(stream.feed(event))
        stream.round.close()
        while messages is not None and stream.round.recalls:
            messages = await _stream_one_recall(ctx, stream, client, messages)
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("recall stream failed: %s", getattr(exc, "category", type(exc).__name__))
        ctx.staged.clear()
        await client.end(_stream_error(stream_failure_message(exc)))
        return
    finally:
        principal.close()
    await client.end(stream.finish())
    last = stream.round.accumulated()
    ctx.check_empty(_PROTOCOL, _visible_empty(last["content"]), last.get("model"),
                    last.get("stop_reason"), last["usage"].get("output_tokens"))
    ctx.delivered()


def _visible_empty(content: list[dict[str, Any]]) -> bool:
    shown = [b for b in content
             if not (b.get("type") == "tool_use" and b.get("name") == RECALL_TOOL_NAME)]
    return telemetry.anthropic_content_is_empty(shown)


async def _stream_one_recall(ctx: RecallContext, stream: AnthropicRecallStream, client: Any,
                             messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """One recall round; returns the follow-up's messages, or None when the
    response ends here (the model also called a visible tool)."""
    round_ = stream.round
    executed = await with_keepalive(client, execute_recall(ctx, round_.recalls, _PROTOCOL),
                                    PING, ctx.keepalive_seconds)
    call = round_.recalls[0]
    assistant, tool_result = follow_up_pair(round_.content(), call, executed.result)
    ctx.staged.append(StagedRecall(executed.anchor_id, executed.marker, call,
                                   executed.result, assistant, tool_result))
    if round_.visible_tool_uses:
        # Mixed: the client runs its own tool; the recall is replayed next turn.
        if executed.marker is not None:
            await client.write(stream.inline_marker(executed.marker))
        return None
    await client.write(stream.close_preamble())
    if executed.marker is not None:
        await client.write(stream.marker_message(executed.marker))
    follow_up = [*messages, assistant, tool_result]
    stream.begin_continuation()
    await _stream_follow_up(ctx, stream, client, follow_up, assistant, tool_result)
    return follow_up


async def _stream_follow_up(ctx: RecallContext, stream: AnthropicRecallStream, client: Any,
                            follow_up: list[dict[str, Any]], assistant: dict[str, Any],
                            tool_result: dict[str, Any]) -> None:
    answer = await stream_follow_up(ctx, _PROTOCOL, client, follow_up,
                                    _recovery_messages(follow_up, tool_result), PING)
    try:
        async for event in answer.events:
            await client.write(stream.feed(event))
        stream.round.close()
    finally:
        answer.close()


def _recovery_messages(follow_up: list[dict[str, Any]],
                       tool_result: dict[str, Any]) -> list[dict[str, Any]]:
    """The follow-up once more, telling the model to answer without recall."""
    block = tool_result["content"][0]
    recovered = {**tool_result, "content": [
        {**block, "content": _final_round_result(str(block["content"]))}]}
    return [*follow_up[:-1], recovered]


# --- non-streaming client -------------------------------------------------------------


async def buffered_recall(ctx: RecallContext, principal: dict[str, Any]) -> tuple[
        int, bytes, list[tuple[bytes, bytes]]]:
    """The buffered loop (C.3) for a non-streaming Anthropic client. Returns the
    status, body and extra headers the client gets."""
    try:
        message = await _buffered_loop(ctx, _check_message(principal))
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("buffered recall failed: %s", getattr(exc, "category", type(exc).__name__))
        ctx.staged.clear()
        return 502, error_body("server_error", RECALL_FAILED), _JSON_HEADERS
    headers = _JSON_HEADERS + ([RECALL_INVOKED_HEADER] if ctx.staged else [])
    usage = message.get("usage") or {}
    ctx.check_empty(_PROTOCOL, _visible_empty(message["content"]), message.get("model"),
                    message.get("stop_reason"), usage.get("output_tokens"))
    return 200, orjson.dumps(message), headers


async def _buffered_loop(ctx: RecallContext, message: dict[str, Any]) -> dict[str, Any]:
    messages = list(ctx.body.get("messages") or [])
    delivered: list[dict[str, Any]] = []
    usages = [message.get("usage") or {}]
    while True:
        recalls, visible = message_recalls(message)
        if not recalls:
            break
        executed = await execute_recall(ctx, recalls, _PROTOCOL)
        call = recalls[0]
        assistant, tool_result = follow_up_pair(message["content"], call, executed.result)
        ctx.staged.append(StagedRecall(executed.anchor_id, executed.marker, call,
                                       executed.result, assistant, tool_result))
        shown = [b for i, b in enumerate(message["content"]) if i != call.position]
        if executed.marker is not None:
            shown.insert(call.position, {"type": "text", "text": executed.marker})
        if visible:
            delivered += shown
            return {**message, "content": delivered, "usage": _merged(message, usages)}
        delivered += shown
        messages = [*messages, assistant, tool_result]
        message = await _json_follow_up(ctx, messages, tool_result)
        usages.append(message.get("usage") or {})
    if not _usable(message) and ctx.staged:
        raise RecallFailed("follow_up_failed", "recall continuation was not usable")
    return {**message, "content": delivered + message["content"],
            "usage": _merged(message, usages)}


def _merged(message: dict[str, Any], usages: list[dict[str, Any]]) -> dict[str, Any]:
    usage = dict(message.get("usage") or {})
    usage.update(sum_usage(usages))
    return usage


async def _json_follow_up(ctx: RecallContext, messages: list[dict[str, Any]],
                          tool_result: dict[str, Any]) -> dict[str, Any]:
    """A ``stream:false`` follow-up, with one recovery attempt on failure."""
    try:
        answer = await send_counted(ctx, _PROTOCOL, {**ctx.body, "messages": messages},
                                    stream=False)
        assert isinstance(answer, JSONFollowUp)
        return _check_message(answer.payload)
    except (FollowUpError, ProtocolError) as exc:
        log.warning("recall follow-up failed (%s); trying recovery",
                    getattr(exc, "category", "follow_up_protocol"))
        if not ctx.budget.can_recover():
            raise
    recovery = {**ctx.body, "messages": _recovery_messages(messages, tool_result)}
    answer = await send_counted(ctx, _PROTOCOL, recovery, stream=False)
    assert isinstance(answer, JSONFollowUp)
    recovered = _check_message(answer.payload)
    if message_recalls(recovered)[0] or not _usable(recovered):
        metrics.record_followup_failure(_PROTOCOL, "follow_up_failed")
        raise RecallFailed("follow_up_failed", "upstream recovery output was unsafe")
    return recovered


async def read_json_principal(resp: UpstreamResponse) -> dict[str, Any]:
    """Read a non-stream principal answer."""
    body, cut = await resp.read(MAX_JSON_BYTES)
    if cut:
        raise ProtocolError(f"foreground response exceeded {MAX_JSON_BYTES} byte limit")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ProtocolError("upstream Anthropic request did not complete") from None
    if not isinstance(payload, dict):
        raise ProtocolError("upstream Anthropic request did not complete")
    return payload
