"""The asyncio shell around recall on the Responses API and the Codex backend
(lore-spec C.3, C.5, C.6).

Streaming clients: :func:`stream_responses_recall` feeds the upstream to
:class:`~lore_gateway.recall.responses.live.LiveInterceptor` and carries out its
actions — client writes, recall execution, follow-ups — with ``: keepalive``
comments while a recall or a follow-up is in flight.

Non-streaming clients: :func:`buffered_responses_recall` runs the loop on whole
responses. The follow-up's stream flag is the Codex flag: the Codex backend only
streams (its SSE is accumulated), the public API answers ``stream:false`` as JSON.

Either way, staged recalls reach ``ctx.on_delivered`` only once the client has
the whole answer; on failure they are dropped (rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Protocol, TypeVar

import orjson

from lore_gateway.errors import error_body
from lore_gateway.obs import metrics
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.protocols.usage import (
    Usage,
    merge_usage,
    usage_from_responses,
    usage_to_responses,
)
from lore_gateway.recall.anthropic.handler import RecallContext, RecallFailed, StagedRecall
from lore_gateway.recall.anthropic.live import RecallCall
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT
from lore_gateway.recall.core.executor import RecallOutcome
from lore_gateway.recall.core.followup import (
    FollowUpError,
    JSONFollowUp,
    StreamedFollowUp,
    send_follow_up,
)
from lore_gateway.recall.core.markers import anchor_text, new_anchor_id
from lore_gateway.recall.core.tool import (
    RecallArgs,
    RecallArgumentError,
    RecallFrameError,
    decode_arguments,
    is_recall_call,
    parse_arguments,
)
from lore_gateway.recall.responses.live import (
    Action,
    Done,
    FollowUp,
    Limits,
    LiveInterceptor,
    RunRecall,
    Send,
)
from lore_gateway.recall.responses.recovery import FreshIds, repeated_delivery
from lore_gateway.sse import SSEDecoder, SSEEvent, encode_comment
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

RECALL_FAILED = "Recall continuation failed"
RECALL_INVOKED_HEADER = (b"x-lore-recall-invoked", b"true")
# Bun's fetch gives up after ~5 minutes of silence, OpenCode sooner; the reference
# sends a keepalive after 30 s without output.
DEFAULT_KEEPALIVE_SECONDS = 30.0
KEEPALIVE = encode_comment("keepalive")
# A buffered recall chain never runs more rounds than the budget allows; this only
# guards the loop against a budget that never finalises.
_MAX_ROUNDS = 64

T = TypeVar("T")


class ClientWriter(Protocol):
    async def write(self, data: bytes) -> None: ...


# --- follow-up bodies -----------------------------------------------------------------


def _input_items(body: dict[str, Any]) -> list[Any]:
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def follow_up_body(
    base: dict[str, Any],
    items: tuple[dict[str, Any], ...] | list[dict[str, Any]],
    *,
    recovery: bool = False,
) -> dict[str, Any]:
    """The full input plus the round's items. Never ``previous_response_id``
    (the gateway rewrites history, server-side state would disagree); always
    ``store:false``; the tool list (recall included) unchanged."""
    extra = [dict(i) for i in items]
    if recovery and extra and extra[-1].get("type") == "function_call_output":
        output = str(extra[-1].get("output") or "")
        if FINAL_ROUND_TEXT not in output:
            extra[-1]["output"] = f"{output}\n\n{FINAL_ROUND_TEXT}"
    body = {k: v for k, v in base.items() if k != "previous_response_id"}
    body["input"] = _input_items(base) + extra
    body["store"] = False
    return body


async def _event_batches(resp: UpstreamResponse) -> AsyncIterator[list[SSEEvent]]:
    """The events of each body chunk, together (so they reach the client in one write)."""
    decoder = SSEDecoder()
    async for chunk in resp.chunks():
        events = decoder.feed(chunk)
        if events:
            yield events
    tail = decoder.close()
    if tail:
        yield tail


async def _one_by_one(events: AsyncIterator[SSEEvent]) -> AsyncIterator[list[SSEEvent]]:
    async for event in events:
        yield [event]


async def _with_keepalive(client: ClientWriter, work: Awaitable[T], every: float) -> T:
    """Await ``work`` while writing a keepalive comment every ``every`` seconds."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            await client.write(KEEPALIVE)

    beater = asyncio.create_task(beat())
    try:
        return await work
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await beater


# --- streaming clients ----------------------------------------------------------------


async def stream_responses_recall(
    ctx: RecallContext,
    principal: UpstreamResponse,
    client: ClientWriter,
    *,
    codex: bool,
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
    limits: Limits | None = None,
) -> LiveInterceptor:
    """Relay the principal stream with live recall interception. Returns the
    interceptor, whose ``turn_items()`` and ``usage`` are the turn for storage."""
    icpt = LiveInterceptor(budget=ctx.budget, codex=codex, limits=limits)
    batches = _event_batches(principal)
    pending = await _pump(icpt, batches, client)
    while pending:
        sends, pending = _leading_sends(pending)
        if sends:
            await client.write(sends)
            continue
        action = pending.pop(0)
        if isinstance(action, RunRecall):
            more = await _with_keepalive(client, _run_recall(ctx, icpt, action, codex),
                                        keepalive_seconds)
            pending = more + pending
        elif isinstance(action, FollowUp):
            if action.recovery and icpt.recovered_from is not None:
                metrics.record_followup_failure(_label(codex), icpt.recovered_from[0])
                log.warning("recall continuation failed category=%s: %s; recovering",
                            *icpt.recovered_from)
            more = await _with_keepalive(
                client, _stream_follow_up(ctx, icpt, action, codex, client), keepalive_seconds
            )
            pending = more + pending
        elif isinstance(action, Done):
            if icpt.relaying:
                # No recall: whatever follows the terminal is relayed as is.
                trailing, _ = _leading_sends(pending)
                if trailing:
                    await client.write(trailing)
                async for batch in batches:
                    await client.write(b"".join(e.raw for e in batch))
            if action.ok:
                ctx.delivered()
            else:
                ctx.staged.clear()
                if icpt.failure is not None and icpt.recall_ran:
                    metrics.record_followup_failure(_label(codex), icpt.failure[0])
                if icpt.failure is not None:
                    log.warning(
                        "openai-responses recall-aware stream failed category=%s: %s",
                        *icpt.failure,
                    )
            break
    return icpt


def _leading_sends(actions: list[Action]) -> tuple[bytes, list[Action]]:
    """The bytes of the Send actions at the head of ``actions`` (one client write
    instead of one per event), and the actions after them."""
    n = 0
    while n < len(actions) and isinstance(actions[n], Send):
        n += 1
    data = b"".join(a.data for a in actions[:n] if isinstance(a, Send))
    return data, actions[n:]


async def _pump(
    icpt: LiveInterceptor, batches: AsyncIterator[list[SSEEvent]], client: ClientWriter
) -> list[Action]:
    """Feed a stream, writing what the client may see as each upstream chunk
    arrives, until the interceptor needs something other than writes."""
    while True:
        try:
            batch = await anext(batches, None)
        except Exception as exc:  # the body read failed (protocol errors are handled inside)
            category = "follow_up_transport" if icpt.in_continuation else "principal_transport"
            return icpt.follow_up_failed(category, type(exc).__name__)
        actions = icpt.end_of_stream() if batch is None else [
            a for event in batch for a in icpt.feed(event)
        ]
        data, rest = _leading_sends(actions)
        if data:
            await client.write(data)
        if rest or batch is None:
            return rest


async def _execute(ctx: RecallContext, args: RecallArgs, codex: bool) -> RecallOutcome:
    """Run one recall, account it in the budget and the metrics."""
    started = time.perf_counter()
    outcome = await ctx.executor.run(args)
    metrics.record_recall(_label(codex), len(outcome.coverage), time.perf_counter() - started,
                          ok=not outcome.failed)
    ctx.budget.record(outcome.text, outcome.coverage)
    return outcome


async def _run_recall(
    ctx: RecallContext, icpt: LiveInterceptor, run: RunRecall, codex: bool
) -> list[Action]:
    if run.args is None:
        return icpt.recall_done("", None)
    outcome = await _execute(ctx, run.args, codex)
    anchor = new_anchor_id()
    actions = icpt.recall_done(outcome.text, anchor)
    call = {
        "type": "function_call",
        "call_id": run.call_id,
        "name": "recall",
        "arguments": run.arguments,
    }
    output = {
        "type": "function_call_output",
        "call_id": run.call_id,
        "output": ctx.budget.result_for_model(outcome.text),
    }
    ctx.staged.append(
        StagedRecall(
            anchor,
            anchor_text(anchor),
            RecallCall(run.call_id, run.arguments, icpt.depth),
            outcome.text,
            call,
            output,
        )
    )
    return actions


async def _stream_follow_up(
    ctx: RecallContext, icpt: LiveInterceptor, action: FollowUp, codex: bool,
    client: ClientWriter,
) -> list[Action]:
    body = follow_up_body(ctx.body, action.items, recovery=action.recovery)
    log.info("recall (stream, depth=%d): executing follow-up", icpt.depth)
    metrics.record_followup(_label(codex))
    try:
        result = await send_follow_up(ctx.upstream, ctx.url, ctx.headers, body, stream=True)
    except FollowUpError as exc:
        return icpt.follow_up_failed(exc.category, str(exc))
    assert isinstance(result, StreamedFollowUp)
    icpt.begin_continuation(recovery=action.recovery)
    try:
        return await _pump(icpt, _one_by_one(result.events), client)
    finally:
        result.close()


# --- non-streaming clients ------------------------------------------------------------


def _recall_items(response: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    output = response.get("output") or []
    return [
        (i, item)
        for i, item in enumerate(output)
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and is_recall_call(item.get("name"))
    ]


def marker_item(call_id: str, anchor_id: str) -> dict[str, Any]:
    """The anchor as a message item in place of a replaced recall call (B.6)."""
    digest = hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:32]
    return {
        "id": f"msg_lore_recall_{digest}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": anchor_text(anchor_id), "annotations": []}],
    }


def _usable(response: dict[str, Any]) -> bool:
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call" and not is_recall_call(item.get("name")):
            return True
        for part in item.get("content") or [] if item.get("type") == "message" else []:
            if isinstance(part, dict) and (
                part.get("type") == "refusal" or str(part.get("text") or "").strip()
            ):
                return True
    return False


async def buffered_responses_recall(
    ctx: RecallContext, principal: dict[str, Any], *, codex: bool
) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict[str, Any] | None]:
    """Run the recall loop on a whole principal response. Returns status, extra
    headers, the client body, and the final response (None on failure). The
    caller calls ``ctx.delivered()`` once the client has read the body."""
    try:
        final = await _buffered_loop(ctx, principal, codex)
    except RecallFailed as exc:
        ctx.staged.clear()
        log.warning("recall (non-stream) failed category=%s: %s", exc.category, exc)
        return 502, [], error_body("server_error", RECALL_FAILED), None
    headers = [RECALL_INVOKED_HEADER] if ctx.staged or ctx.budget.executions else []
    return 200, headers, orjson.dumps(final), final


async def _buffered_loop(
    ctx: RecallContext, response: dict[str, Any], codex: bool
) -> dict[str, Any]:
    principal_id = response.get("id")
    delivered: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []
    usage: Usage | None = _usage(response)
    recovered = False
    for _ in range(_MAX_ROUNDS):
        recalls = _recall_items(response)
        if not recalls:
            if ctx.budget.executions and not _usable(response):
                raise RecallFailed("follow_up_failed", "recall continuation was not usable")
            return {**_final(response, delivered, usage), "id": principal_id}
        if len(recalls) > 1:
            raise RecallFailed("parallel_recall", "more than one recall in one response")
        if response.get("status") not in (None, "completed"):
            raise RecallFailed(
                "follow_up_failed", "incomplete recall principal cannot execute recall"
            )
        index, call = recalls[0]
        output = response.get("output") or []
        visible_tools = [
            i
            for i in output
            if isinstance(i, dict)
            and i.get("type") == "function_call"
            and not is_recall_call(i.get("name"))
        ]
        result_text, anchor = await _buffered_recall(ctx, call, visible_tools, codex)
        call_id = str(call.get("call_id") or call.get("id") or "")
        pair = [
            {
                "type": "function_call",
                "call_id": call_id,
                "name": "recall",
                "arguments": call.get("arguments") or "",
            },
            {"type": "function_call_output", "call_id": call_id, "output": result_text},
        ]
        before = [i for j, i in enumerate(output) if j != index]
        marker = [marker_item(call_id, anchor)] if anchor else []
        delivered.extend(output[:index] + marker + output[index + 1 :])
        if visible_tools:
            return {**_final({**response, "output": []}, delivered, usage), "id": principal_id}
        extra.extend(before + pair)
        response, usage, recovered = await _continue(ctx, extra, codex, usage, recovered)
    raise RecallFailed("depth_exhausted", "recall chain did not finish")


async def _continue(
    ctx: RecallContext, extra: list[dict[str, Any]], codex: bool, usage: Usage | None,
    recovered: bool,
) -> tuple[dict[str, Any], Usage | None, bool]:
    """One follow-up. A failed or unusable continuation (or one asking for recall
    again in the final round) gets one recovery attempt; the usage of every
    answer, failed ones included, is merged."""
    try:
        response = await _buffered_follow_up(ctx, extra, codex, recovery=False)
        usage = merge_usage(usage, _usage(response))
        problem = _continuation_problem(ctx, response)
    except (FollowUpError, ProtocolError) as exc:
        problem = ("follow_up_failed", str(exc))
    if problem is None:
        return response, usage, recovered
    category, reason = problem
    metrics.record_followup_failure(_label(codex), category)
    if recovered or not ctx.budget.can_recover():
        raise RecallFailed(category, reason)
    log.warning("recall continuation failed category=%s: %s; recovering", category, reason)
    response = await _recover(ctx, extra, codex)
    return response, merge_usage(usage, _usage(response)), True


def _continuation_problem(
    ctx: RecallContext, response: dict[str, Any]
) -> tuple[str, str] | None:
    status = response.get("status")
    if status in ("failed", "cancelled") or response.get("error"):
        return "follow_up_failed", f"upstream Responses request ended with status {status}"
    if _recall_items(response):
        if ctx.budget.final_round:
            return "depth_exhausted", "recall requested in the final round"
        return None
    if not _usable(response):
        return "follow_up_failed", "recall continuation was not usable"
    return None


def _label(codex: bool) -> str:
    """The metrics' protocol label."""
    return "codex" if codex else "responses"


async def _recover(ctx: RecallContext, extra: list[dict[str, Any]], codex: bool) -> dict[str, Any]:
    try:
        response = await _buffered_follow_up(ctx, extra, codex, recovery=True)
    except (FollowUpError, ProtocolError) as exc:
        raise RecallFailed("follow_up_failed", str(exc)) from exc
    if response.get("status") in ("failed", "cancelled") or response.get("error"):
        raise RecallFailed("follow_up_failed", "upstream recovery request failed")
    if _recall_items(response) or not _usable(response):
        raise RecallFailed("follow_up_failed", "upstream recovery output was unsafe")
    repeat = repeated_delivery(
        [i for i in response.get("output") or [] if isinstance(i, dict)], extra)
    if repeat is not None:
        raise RecallFailed("follow_up_failed", repeat)
    fresh = FreshIds()
    try:
        output = [fresh.item(i) if isinstance(i, dict) else i
                  for i in response.get("output") or []]
    except ProtocolError as exc:
        raise RecallFailed("resource_limit", str(exc)) from None
    return {**response, "output": output}


async def _buffered_recall(
    ctx: RecallContext, call: dict[str, Any], visible_tools: list[Any], codex: bool
) -> tuple[str, str | None]:
    arguments = call.get("arguments") or ""
    try:
        args = parse_arguments(decode_arguments(arguments))
    except RecallFrameError as exc:
        raise RecallFailed("recall_execution", str(exc)) from None
    except RecallArgumentError as exc:
        if visible_tools:
            raise RecallFailed(
                "recall_execution", "invalid call alongside a visible tool"
            ) from None
        return exc.tool_result(), None
    refused = ctx.budget.admit(args)
    if refused is not None:
        raise RecallFailed("depth_exhausted", f"recall budget refused: {refused}")
    outcome = await _execute(ctx, args, codex)
    anchor = new_anchor_id()
    result = ctx.budget.result_for_model(outcome.text)
    call_id = str(call.get("call_id") or call.get("id") or "")
    fc = {"type": "function_call", "call_id": call_id, "name": "recall", "arguments": arguments}
    fco = {"type": "function_call_output", "call_id": call_id, "output": result}
    ctx.staged.append(
        StagedRecall(
            anchor,
            anchor_text(anchor),
            RecallCall(call_id, str(arguments), ctx.budget.executions),
            outcome.text,
            fc,
            fco,
        )
    )
    return result, anchor


async def _buffered_follow_up(
    ctx: RecallContext, extra: list[dict[str, Any]], codex: bool, *, recovery: bool
) -> dict[str, Any]:
    body = follow_up_body(ctx.body, extra, recovery=recovery)
    log.info(
        "recall (non-stream, depth=%d, codex=%s): executing follow-up", ctx.budget.executions, codex
    )
    metrics.record_followup(_label(codex))
    result = await send_follow_up(ctx.upstream, ctx.url, ctx.headers, body, stream=codex)
    if isinstance(result, JSONFollowUp):
        response = result.payload
    else:
        acc = ResponsesAccumulator("codex")
        try:
            async for event in result.events:
                acc.feed_event(event)
            acc.close()
        finally:
            result.close()
        response = acc.response_body()
    return response


def _usage(response: dict[str, Any]) -> Usage | None:
    raw = response.get("usage")
    if raw is None:
        return None
    try:
        return usage_from_responses(raw)
    except ProtocolError:
        return None


def _final(
    response: dict[str, Any], delivered: list[dict[str, Any]], usage: Usage | None
) -> dict[str, Any]:
    out = dict(response)
    out["output"] = delivered + list(response.get("output") or [])
    if usage is not None:
        out["usage"] = usage_to_responses(usage)
    return out
