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

import msgspec

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
from lore_gateway.recall.core.machine import FollowUp, RunRecall
from lore_gateway.recall.core.markers import anchor_text, new_anchor_id
from lore_gateway.recall.responses.buffered import (
    buffered_responses_recall,
    follow_up_body,
    label,
)
from lore_gateway.recall.responses.live import LiveInterceptor
from lore_gateway.recall.responses.principal import PrincipalReader
from lore_gateway.recall.responses.round import Action, Done, Limits, Send
from lore_gateway.sse import SSEEvent, encode_comment
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

KEEPALIVE = encode_comment("keepalive")

__all__ = ["buffered_responses_recall", "follow_up_body", "stream_responses_recall"]


class _Principal:
    """The principal's body for the pump: upstream reads through a
    :class:`~.principal.PrincipalReader`."""

    def __init__(self, icpt: LiveInterceptor, resp: UpstreamResponse) -> None:
        self._icpt = icpt
        self._reads = resp.chunks()
        self.reader = PrincipalReader(icpt)
        self._ended = False

    async def step(self) -> tuple[list[Action], bool]:
        """The actions for the next upstream read; True once the body ended."""
        if self._ended:
            return self._icpt.end_of_stream(), True
        data = await anext(self._reads, None)
        if data is not None:
            return self.reader.feed(data), False
        self._ended = True
        actions = self.reader.end()
        return (actions, False) if actions else (self._icpt.end_of_stream(), True)

    def broken(self) -> list[Action]:
        return self.reader.broken()

    async def rest(self) -> AsyncIterator[bytes]:
        """Whatever follows the terminal, relayed as it comes."""
        async for data in self._reads:
            out = self.reader.after_terminal(data)
            if out:
                yield out
        last = self.reader.close_after_terminal()
        if last:
            yield last


class _FollowUp:
    """A follow-up's events, fed one by one (its stream is spooled anyway)."""

    def __init__(self, icpt: LiveInterceptor, events: AsyncIterator[SSEEvent]) -> None:
        self._icpt = icpt
        self._events = events

    async def step(self) -> tuple[list[Action], bool]:
        event = await anext(self._events, None)
        if event is None:
            return self._icpt.end_of_stream(), True
        return self._icpt.feed_all([event]), False

    def broken(self) -> list[Action]:
        return []


class Streamed(msgspec.Struct, frozen=True):
    """A served stream: the interceptor (the turn's items, usage, failure) and,
    when it never needed the items, the terminal frame that repeats them."""

    interceptor: LiveInterceptor
    untouched: bytes | None


# --- streaming clients ----------------------------------------------------------------


async def stream_responses_recall(
    ctx: RecallContext,
    principal: UpstreamResponse,
    client: ClientWriter,
    *,
    codex: bool,
    keepalive_seconds: float = DEFAULT_KEEPALIVE_SECONDS,
    limits: Limits | None = None,
) -> Streamed:
    """Relay the principal stream with live recall interception. The turn for
    storage is the interceptor's ``turn_items()``, or the untouched terminal."""
    icpt = LiveInterceptor(budget=ctx.budget, codex=codex, limits=limits)
    body = _Principal(icpt, principal)
    pending = await _pump(icpt, body, client)
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
                async for data in body.rest():
                    await client.write(data)
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
    return Streamed(icpt, body.reader.untouched())


def _leading_sends(actions: list[Action]) -> tuple[bytes, list[Action]]:
    """The bytes of the Send actions at the head of ``actions`` (one client write
    instead of one per event), and the actions after them."""
    n = 0
    while n < len(actions) and isinstance(actions[n], Send):
        n += 1
    data = b"".join(a.data for a in actions[:n] if isinstance(a, Send))
    return data, actions[n:]


async def _pump(icpt: LiveInterceptor, body: _Principal | _FollowUp,
                client: ClientWriter) -> list[Action]:
    """Feed a stream, writing what the client may see as each upstream chunk
    arrives, until the interceptor needs something other than writes."""
    while True:
        try:
            actions, ended = await body.step()
        except Exception as exc:  # the body read failed (protocol errors are handled inside)
            category = "follow_up_transport" if icpt.in_continuation else "principal_transport"
            return [*body.broken(), *icpt.follow_up_failed(category, transport_reason(exc))]
        data, rest = _leading_sends(actions)
        if data:
            await client.write(data)
        if rest or ended:
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
        return await _pump(icpt, _FollowUp(icpt, result.events), client)
    finally:
        result.close()
