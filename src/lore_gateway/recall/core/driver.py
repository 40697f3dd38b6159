"""The asyncio shell that carries out the chain machine's actions.

Two drivers, one machine: :func:`run_buffered` for a non-streaming client (whole
JSON answers; a Codex stream arrives accumulated) and :func:`run_streamed` for a
streaming client whose answer is relayed live through the protocol's sans-IO
interceptor. What differs between protocols is behind a small adapter
(:class:`BufferedAdapter`, :class:`StreamAdapter`): reading an answer into a
:class:`~lore_gateway.recall.core.machine.Round`, building the follow-up pair,
and the bytes or body the client gets. The policy is the machine's alone.

Failure accounting: every failure decision is counted once in the follow-up
failure metric by its C.7 category (a follow-up that did not answer is counted
where it was sent, in ``send_counted``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Protocol

import msgspec
import orjson

from lore_gateway.errors import error_body
from lore_gateway.obs import metrics
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.usage import Usage
from lore_gateway.recall.core.chain import (
    JSON_HEADERS,
    RECALL_FAILED,
    RECALL_INVOKED_HEADER,
    ClientWriter,
    ExecutedRecall,
    RecallCall,
    RecallContext,
    RecallFailed,
    StagedRecall,
    execute_recall,
    failure_category,
    send_counted,
    stream_failure_message,
    with_keepalive,
)
from lore_gateway.recall.core.followup import FollowUpError, JSONFollowUp, StreamedFollowUp
from lore_gateway.recall.core.machine import (
    ChainAction,
    ChainMachine,
    Deliver,
    Fail,
    FollowUp,
    Round,
    RunRecall,
)
from lore_gateway.sse import DEFAULT_MAX_EVENT_BYTES, SSEDecoder, SSEEvent
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

# A buffered chain never runs more rounds than the budget allows; this only guards
# the loop against a budget that never finalises.
MAX_ROUNDS = 64


class BufferedAdapter(Protocol):
    """One protocol's whole-answer side of the chain, for one request."""

    label: str  # the metrics' protocol label
    strict_frames: bool  # non-JSON recall arguments fail the chain (Responses)

    def round(self, answer: dict[str, Any]) -> Round:
        """Summarise an answer (validated; raises ``ProtocolError``)."""

    def call(self) -> RecallCall:
        """The recall call of the answer last summarised."""

    def recalled(self, executed: ExecutedRecall) -> tuple[dict[str, Any], dict[str, Any]]:
        """Record the recall in what the client will see and in the follow-up
        history; return the (assistant, tool result) pair the follow-up appends."""

    async def follow_up(self, ctx: RecallContext, *, recovery: bool) -> dict[str, Any]:
        """Send the follow-up (or the recovery) and return its whole answer."""

    def delivered(self, answer: dict[str, Any], *, mixed: bool) -> dict[str, Any]:
        """The body the client gets, built from everything delivered so far."""


class StreamAdapter(Protocol):
    """One protocol's live-stream side of the chain, for one request."""

    label: str
    keepalive: bytes  # the protocol's own keepalive frame

    def feed(self, event: SSEEvent) -> bytes:
        """Apply one upstream event; the bytes the client gets now."""

    def can_take(self) -> bool:
        """Whether the round is where ``take`` may apply (the message started)."""

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        """Take the text deltas at the start of a principal's read in one go:
        the bytes (to forward as they are) and frames taken, at most
        ``max_frames`` (0, 0: decode the read)."""

    def round(self) -> Round:
        """The current round ended; summarise it (raises ``ProtocolError``)."""

    def call(self) -> RecallCall:
        """The recall call of the current round."""

    def recalled(self, executed: ExecutedRecall, *, mixed: bool) -> tuple[
            bytes, dict[str, Any], dict[str, Any]]:
        """The bytes that show the recall (marker) and the follow-up pair; a
        recall-only round also starts the next round here."""

    def follow_up_body(self, ctx: RecallContext, *, recovery: bool) -> dict[str, Any]:
        """The next streamed follow-up's body."""

    def finish(self) -> bytes:
        """The held terminal events, now released (usage of every round)."""


def _count(label: str, action: ChainAction, machine: ChainMachine, *,
           counted: bool = False) -> ChainAction:
    """Count a failure decision (a failed chain, or the failure a recovery answers)
    in the metrics, unless ``counted`` (``send_counted`` already did)."""
    recovery = isinstance(action, FollowUp) and action.recovery
    if recovery and machine.recovered_from is not None:
        log.warning("recall continuation failed category=%s: %s; recovering",
                    *machine.recovered_from)
    if counted:
        return action
    if isinstance(action, Fail):
        metrics.record_followup_failure(label, action.category)
    elif recovery and machine.recovered_from is not None:
        metrics.record_followup_failure(label, machine.recovered_from[0])
    return action


def _staged(ctx: RecallContext, call: RecallCall, executed: ExecutedRecall,
            pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    ctx.staged.append(StagedRecall(executed.anchor_id, executed.marker, call,
                                   executed.result, pair[0], pair[1]))


# --- whole answers ---------------------------------------------------------------------


async def run_buffered(ctx: RecallContext, adapter: BufferedAdapter,
                       principal: dict[str, Any]) -> dict[str, Any]:
    """The recall loop on whole answers; the client's body. Raises
    :class:`RecallFailed` (staged recalls are then to be dropped)."""
    machine = ChainMachine(ctx.budget)
    action: ChainAction = _count(adapter.label, machine.round(adapter.round(principal)), machine)
    answer = principal
    for _ in range(MAX_ROUNDS):
        if isinstance(action, RunRecall):
            call = adapter.call()
            executed = await _execute(ctx, machine, adapter.label, call, adapter.strict_frames)
            _staged(ctx, call, executed, adapter.recalled(executed))
            action = machine.recall_ran()
        elif isinstance(action, FollowUp):
            counted = False
            try:
                answer = await adapter.follow_up(ctx, recovery=action.recovery)
                action = machine.round(adapter.round(answer))
            except FollowUpError as exc:
                action, counted = machine.follow_up_failed(exc.category, str(exc)), True
            except ProtocolError as exc:
                action = machine.follow_up_failed("follow_up_failed", str(exc))
            action = _count(adapter.label, action, machine, counted=counted)
        elif isinstance(action, Deliver):
            return adapter.delivered(answer, mixed=action.mixed)
        else:
            raise RecallFailed(action.category, action.reason)
    raise RecallFailed("depth_exhausted", "recall chain did not finish")


async def _execute(ctx: RecallContext, machine: ChainMachine, label: str, call: RecallCall,
                   strict_frames: bool) -> ExecutedRecall:
    try:
        return await execute_recall(ctx, call, label, strict_frames=strict_frames,
                                    alongside_visible_tool=machine.visible_tools > 0)
    except RecallFailed as exc:
        _count(label, machine.fail(exc.category, str(exc)), machine)
        raise


# --- live streams --------------------------------------------------------------------


async def relay(adapter: StreamAdapter, batches: AsyncIterator[list[SSEEvent]],
                client: ClientWriter) -> None:
    """Feed an upstream stream through the adapter, writing what the client may
    see as it arrives: one write per batch of events (one upstream read). An
    event the adapter refuses still lets the client have what came before it."""
    async for batch in batches:
        await _write_through(client, partial(_fed, adapter, batch))


async def relay_reads(adapter: StreamAdapter, resp: UpstreamResponse,
                      client: ClientWriter) -> None:
    """:func:`relay` for the principal, read by read: the text deltas the round
    takes in one go (``take``) go out as they came, everything else is decoded
    and fed event by event. Until the round can take deltas (its first frames:
    the message's start), a read is fed a frame at a time, so that the deltas
    after them in the same read can be taken."""
    decoder = SSEDecoder()

    def step(data: bytes, out: list[bytes]) -> None:
        rest = _take(adapter, decoder, data, out)
        if rest:
            _fed(adapter, decoder.feed(rest), out)

    async for data in resp.chunks():
        await _write_through(client, partial(step, data))
    tail = decoder.close()
    if tail:
        await _write_through(client, partial(_fed, adapter, tail))


async def _write_through(client: ClientWriter, step: Callable[[list[bytes]], None]) -> None:
    """Run ``step``, which appends what the client gets to a list, and write
    that in one go; when it raises, write what it got to first, and re-raise."""
    out: list[bytes] = []
    try:
        step(out)
    except Exception:
        if out:
            await client.write(b"".join(out))
        raise
    if out:
        await client.write(out[0] if len(out) == 1 else b"".join(out))


def _fed(adapter: StreamAdapter, events: list[SSEEvent], out: list[bytes]) -> None:
    for event in events:
        data = adapter.feed(event)
        if data:
            out.append(data)


def _take(adapter: StreamAdapter, decoder: SSEDecoder, data: bytes, out: list[bytes]) -> bytes:
    """Feed the frames at the start of ``data`` until the round can take deltas,
    then let it take them; what is left of ``data`` (appending what the client
    gets to ``out``). A frame the last read left unfinished is finished first
    (network reads seldom end on a frame's end)."""
    pos = 0
    if not decoder.idle:
        pos = decoder.pending_end(data)
        if pos == -1:
            return data
        _fed(adapter, decoder.feed(data[:pos]), out)
    while decoder.idle and not adapter.can_take():
        end = data.find(b"\n\n", pos)
        if end == -1:
            break
        _fed(adapter, decoder.feed(data[pos : end + 2]), out)
        pos = end + 2
    if (pos < len(data) and decoder.idle and adapter.can_take()
            and len(data) - pos <= DEFAULT_MAX_EVENT_BYTES):  # else the decoder's limit applies
        rest = data[pos:] if pos else data
        taken, frames = adapter.take(rest, decoder.frame_room)
        if taken:
            decoder.count(frames, taken)
            out.append(rest[:taken])
            pos += taken
    return data[pos:] if pos else data


async def _one_by_one(events: AsyncIterator[SSEEvent]) -> AsyncIterator[list[SSEEvent]]:
    async for event in events:
        yield [event]


async def run_streamed(ctx: RecallContext, adapter: StreamAdapter,
                       principal: UpstreamResponse, client: ClientWriter) -> bytes:
    """Relay the principal live, run its recalls and relay their continuations;
    return the closing bytes. Raises :class:`RecallFailed`, ``FollowUpError`` or
    ``ProtocolError`` (the caller ends the stream with the protocol's error)."""
    machine = ChainMachine(ctx.budget)
    await relay_reads(adapter, principal, client)
    action: ChainAction = _count(adapter.label, machine.round(adapter.round()), machine)
    while True:
        if isinstance(action, RunRecall):
            call = adapter.call()
            executed = await with_keepalive(
                client, _execute(ctx, machine, adapter.label, call, False),
                adapter.keepalive, ctx.keepalive_seconds)
            mixed = machine.visible_tools > 0
            shown, *pair = adapter.recalled(executed, mixed=mixed)
            _staged(ctx, call, executed, (pair[0], pair[1]))
            if shown:
                await client.write(shown)
            action = machine.recall_ran()
        elif isinstance(action, FollowUp):
            action = await _stream_follow_up(ctx, machine, adapter, client, action.recovery)
        elif isinstance(action, Deliver):
            return adapter.finish()
        else:
            raise RecallFailed(action.category, action.reason)


async def _stream_follow_up(ctx: RecallContext, machine: ChainMachine, adapter: StreamAdapter,
                            client: ClientWriter, recovery: bool) -> ChainAction:
    body = adapter.follow_up_body(ctx, recovery=recovery)
    try:
        answer = await with_keepalive(client, send_counted(ctx, adapter.label, body, stream=True),
                                      adapter.keepalive, ctx.keepalive_seconds)
    except FollowUpError as exc:
        log.warning("recall follow-up failed (%s)", exc.category)
        action = machine.follow_up_failed(exc.category, str(exc))
        return _count(adapter.label, action, machine, counted=True)
    assert isinstance(answer, StreamedFollowUp)
    try:
        await relay(adapter, _one_by_one(answer.events), client)
        return _count(adapter.label, machine.round(adapter.round()), machine)
    finally:
        answer.close()


# --- the two messages-shaped protocols (Anthropic, Chat) ------------------------------


class MessagesFollowUps:
    """Follow-ups for a protocol whose history is a list of messages
    (``messages``; Gemini's ``contents``): the request's messages plus each
    recall pair; the recovery request retells the last tool result with the
    final-round instruction (the protocol's ``recovery``)."""

    label: str
    messages: list[dict[str, Any]]
    # The protocol's recovery rewrite of the follow-up history.
    recovery: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    # Where the request keeps that history (Gemini: ``contents``).
    history_key = "messages"

    def follow_up_body(self, ctx: RecallContext, *, recovery: bool) -> dict[str, Any]:
        messages = self.recovery(self.messages) if recovery else self.messages
        return {**ctx.body, self.history_key: messages}

    async def follow_up(self, ctx: RecallContext, *, recovery: bool) -> dict[str, Any]:
        """A ``stream:false`` follow-up, for a non-streaming client."""
        answer = await send_counted(ctx, self.label, self.follow_up_body(ctx, recovery=recovery),
                                    stream=False)
        assert isinstance(answer, JSONFollowUp)
        return answer.payload


class LiveRound(Protocol):
    """What a protocol's live round (``AnthropicRound``, ``ChatRound``) offers."""

    @property
    def recalls(self) -> list[RecallCall]: ...

    @property
    def visible_tools(self) -> int: ...

    def usable(self) -> bool: ...

    def close(self) -> None: ...

    def can_take(self) -> bool: ...

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]: ...


class LiveStream(Protocol):
    """A protocol's live recall stream (``AnthropicRecallStream``, ``ChatRecallStream``)."""

    @property
    def round(self) -> LiveRound: ...

    def feed(self, event: SSEEvent) -> bytes: ...

    def finish(self) -> bytes: ...


class MessagesStream(MessagesFollowUps):
    """The part of a messages-shaped live adapter that is the same everywhere."""

    def __init__(self, ctx: RecallContext, stream: LiveStream) -> None:
        self.live = stream
        self.messages = list(ctx.body.get(self.history_key) or [])

    def feed(self, event: SSEEvent) -> bytes:
        return self.live.feed(event)

    def can_take(self) -> bool:
        return self.live.round.can_take()

    def take(self, data: bytes, max_frames: int) -> tuple[int, int]:
        return self.live.round.take(data, max_frames)

    def round(self) -> Round:
        rnd = self.live.round
        rnd.close()
        return Round(len(rnd.recalls), rnd.visible_tools, rnd.usable(), relayed=True)

    def call(self) -> RecallCall:
        return self.live.round.recalls[0]

    def finish(self) -> bytes:
        return self.live.finish()


class OneRound(msgspec.Struct, frozen=True):
    """A streamed answer that reached the client in one round, every event as
    the upstream sent it (no recall ran): its usage as the round read it, None
    when the stream reported none. The caller need not read the client's bytes
    for it again."""

    usage: Usage | None


class ClientStream(Protocol):
    """The client channel as a streamed recall answer uses it."""

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def end(self, data: bytes = b"") -> None: ...


class ServedStream(StreamAdapter, Protocol):
    def error_frame(self, message: str) -> bytes:
        """The protocol's error event, ending a stream that cannot finish."""

    def report_empty(self, ctx: RecallContext) -> None:
        """Empty-completion telemetry for what the client got."""


class ServedJSON(BufferedAdapter, Protocol):
    def report_empty(self, ctx: RecallContext, body: dict[str, Any]) -> None:
        """Empty-completion telemetry for the body the client gets."""


async def serve_stream(ctx: RecallContext, adapter: ServedStream, principal: UpstreamResponse,
                       client: ClientStream, headers: list[tuple[bytes, bytes]]) -> bool:
    """A streaming client's whole response: the chain relayed live, then the
    closing bytes, or the protocol's error event (never a success terminal).
    Whether the client got the whole answer (False: it ended with the error)."""
    await client.start(200, headers)
    try:
        closing = await run_streamed(ctx, adapter, principal, client)
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("%s recall stream failed: %s", adapter.label,
                    failure_category(exc))
        ctx.staged.clear()
        await client.end(adapter.error_frame(stream_failure_message(exc)))
        return False
    finally:
        principal.close()
    await client.end(closing)
    adapter.report_empty(ctx)
    ctx.delivered()
    return True


async def serve_json(ctx: RecallContext, adapter: ServedJSON,
                     principal: dict[str, Any]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """A non-streaming client's status, body and headers (502 "Recall continuation
    failed" when the chain cannot deliver)."""
    try:
        body = await run_buffered(ctx, adapter, principal)
    except (RecallFailed, FollowUpError, ProtocolError) as exc:
        log.warning("%s buffered recall failed: %s", adapter.label,
                    failure_category(exc))
        ctx.staged.clear()
        return 502, error_body("server_error", RECALL_FAILED), JSON_HEADERS
    adapter.report_empty(ctx, body)
    headers = JSON_HEADERS + ([RECALL_INVOKED_HEADER] if ctx.staged else [])
    return 200, orjson.dumps(body), headers
