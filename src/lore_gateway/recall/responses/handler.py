"""The asyncio shell around live recall on the Responses API and the Codex backend
(lore-spec C.5), for streaming clients.

:func:`stream_responses_recall` feeds the upstream to
:class:`~lore_gateway.recall.responses.live.LiveInterceptor` and carries out its
actions — client writes, recall execution, follow-ups — with ``: keepalive``
comments while a recall or a follow-up is in flight. Non-streaming clients are
served by :mod:`~lore_gateway.recall.responses.buffered` on the core chain driver.

Staged recalls reach ``ctx.on_delivered`` only once the client has the whole
answer; on failure they are dropped (rolled back).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from lore_gateway.obs import metrics
from lore_gateway.recall.core.chain import (
    DEFAULT_KEEPALIVE_SECONDS,
    ClientWriter,
    RecallCall,
    RecallContext,
    StagedRecall,
    run_recall,
    transport_reason,
    with_keepalive,
)
from lore_gateway.recall.core.followup import FollowUpError, StreamedFollowUp, send_follow_up
from lore_gateway.recall.core.markers import anchor_text, new_anchor_id
from lore_gateway.recall.responses.buffered import (
    buffered_responses_recall,
    follow_up_body,
    label,
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
from lore_gateway.sse import SSEDecoder, SSEEvent, encode_comment
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

KEEPALIVE = encode_comment("keepalive")

__all__ = ["buffered_responses_recall", "follow_up_body", "stream_responses_recall"]


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
            more = await with_keepalive(client, _run_recall(ctx, icpt, action, codex),
                                        KEEPALIVE, keepalive_seconds)
            pending = more + pending
        elif isinstance(action, FollowUp):
            if action.recovery and icpt.recovered_from is not None:
                metrics.record_followup_failure(label(codex), icpt.recovered_from[0])
                log.warning("recall continuation failed category=%s: %s; recovering",
                            *icpt.recovered_from)
            more = await with_keepalive(
                client, _stream_follow_up(ctx, icpt, action, codex, client), KEEPALIVE,
                keepalive_seconds)
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
                    metrics.record_followup_failure(label(codex), icpt.failure[0])
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
            return icpt.follow_up_failed(category, transport_reason(exc))
        actions = icpt.end_of_stream() if batch is None else icpt.feed_all(batch)
        data, rest = _leading_sends(actions)
        if data:
            await client.write(data)
        if rest or batch is None:
            return rest


async def _run_recall(
    ctx: RecallContext, icpt: LiveInterceptor, run: RunRecall, codex: bool
) -> list[Action]:
    if run.args is None:
        return icpt.recall_done("", None)
    outcome = await run_recall(ctx, run.args, label(codex))
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
    metrics.record_followup(label(codex))
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
