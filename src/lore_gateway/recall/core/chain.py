"""The recall chain's shared vocabulary and the asyncio steps every protocol takes.

Vocabulary: a :class:`RecallCall` the model made, a :class:`StagedRecall` that ran
(kept for replay once the client has the answer), :class:`RecallFailed` with its
lore-spec C.7 category, and the :class:`RecallContext` of one client request.
Steps: :func:`execute_recall` (admit, run and account one recall),
:func:`send_counted` (the one follow-up sender, with its metrics) and
:func:`with_keepalive`. The policy that decides *which* step comes next is the
sans-IO :mod:`~lore_gateway.recall.core.machine`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from lore_gateway.channel import JSON_HEADERS as JSON_HEADERS  # for the protocol handlers
from lore_gateway.obs import metrics
from lore_gateway.protocols.accumulator import StateLimitExceeded
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.recall.core import telemetry
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT, RecallChainBudget
from lore_gateway.recall.core.executor import RecallExecutor, RecallOutcome
from lore_gateway.recall.core.followup import (
    FollowUpError,
    JSONFollowUp,
    StreamedFollowUp,
    StreamFlag,
    body_stream_flag,
    send_follow_up,
)
from lore_gateway.recall.core.markers import anchored_marker, new_anchor_id, visible_marker
from lore_gateway.recall.core.tool import (
    RecallArgs,
    RecallArgumentError,
    RecallFrameError,
    decode_arguments,
    parse_arguments,
)
from lore_gateway.sse import SSEEvent
from lore_gateway.upstream import UpstreamBroken, UpstreamClient, UpstreamResponse

log = logging.getLogger("lore.recall")

RECALL_FAILED = "Recall continuation failed"
STREAM_RECALL_FAILED = "Lore could not continue the response after recall"
RECALL_INVOKED_HEADER = (b"x-lore-recall-invoked", b"true")
# A non-stream answer larger than this is not a plausible single message.
MAX_JSON_BYTES = 4 * 1024 * 1024
# Bun's fetch (Claude Code) gives up after about five minutes of silence and some
# agents sooner; the reference writes a keepalive after 30 s without output.
DEFAULT_KEEPALIVE_SECONDS = 30.0

T = TypeVar("T")

# lore-spec C.7 failure categories (plus the principal's own, which are never a
# follow-up's); a plain str so metrics and logs take it as is.
FailureCategory = str
# Failures a recovery request would only hit again: never recovered.
NOT_RECOVERABLE: frozenset[str] = frozenset(
    {"parallel_recall", "follow_up_usage_missing", "resource_limit"})
# Failures of the upstream itself (a broken connection, a malformed or cut
# stream): the client's error names the reason. Recall's own failures keep the
# spec's fixed words alone, so nothing of the recall reaches the client.
UPSTREAM_FAILURES: frozenset[str] = frozenset({
    "principal_transport", "follow_up_transport", "principal_protocol",
    "follow_up_protocol", "principal_missing_terminal"})


class RecallFailed(Exception):
    """The recall chain cannot deliver an answer. ``category`` is the C.7 code."""

    def __init__(self, category: FailureCategory, message: str) -> None:
        super().__init__(message)
        self.category = category


@dataclass(frozen=True, slots=True)
class RecallCall:
    """A hidden recall call, complete.

    ``tool_use_id`` is the call's id on the wire (``tool_use.id``, Chat
    ``tool_calls[].id``, Responses ``call_id``); ``arguments`` the JSON text
    exactly as the model produced it; ``position`` where the call sits in the
    model's output, which is where the follow-up replays it.
    """

    tool_use_id: str
    arguments: str
    position: int


@dataclass(frozen=True, slots=True)
class StagedRecall:
    """A recall that ran, to be stored for expansion once the client got the answer.

    ``assistant`` and ``tool_result`` are the exact two objects the follow-up
    appended, so expansion can restore upstream history byte for byte.
    """

    anchor_id: str | None
    marker: str | None
    call: RecallCall
    result: str
    assistant: dict[str, Any]
    tool_result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ExecutedRecall:
    result: str  # what the model reads (budget guidance included)
    marker: str | None  # None for an invalid call: nothing visible, nothing stored
    anchor_id: str | None


class FollowUpFit(Protocol):
    """Keeps recall follow-ups inside the model's window (context management's
    side of the chain; ``recall/fit.py``). A follow-up is the planned context
    plus the recall pairs, so a long chain can outgrow what was planned."""

    async def before(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body``, or the same follow-up on a context re-planned to fit."""
        ...

    async def after_refusal(self, body: dict[str, Any], status: int,
                            error: bytes) -> dict[str, Any] | None:
        """The follow-up to send once more after the upstream refused ``body``
        as too long (re-planned at a higher layer); None for any other error."""
        ...


class ClientWriter(Protocol):
    """The part of the client channel the recall paths write through."""

    async def write(self, data: bytes) -> None: ...


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
    # What a streamed Anthropic or Chat round may retain (LORE_RECALL_RETAINED_MAX_BYTES).
    retained_bytes: int = 16 * 1024 * 1024
    # Context management's fit of each follow-up (None: sent as built).
    fit: FollowUpFit | None = None
    # Where a follow-up says whether it streams (Gemini: in the URL).
    stream_flag: StreamFlag = body_stream_flag

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


# --- steps ---------------------------------------------------------------------------


def admit(ctx: RecallContext, call: RecallCall, *, alongside_visible_tool: bool,
          strict_frames: bool = False) -> RecallArgs | str:
    """The validated arguments of a call the budget admits, or the tool result an
    invalid call gets instead (lore-spec B.5). Raises :class:`RecallFailed` for an
    invalid call next to a visible tool (B.5: a hard failure, nothing could be
    replayed) and for a call the budget refuses (``depth_exhausted``).

    ``strict_frames`` (Responses): arguments that are not JSON text are a broken
    frame and fail the chain; elsewhere they are an invalid call like any other.
    """
    try:
        args = parse_arguments(decode_arguments(call.arguments))
    except RecallFrameError as exc:
        if strict_frames:
            raise RecallFailed("recall_execution", str(exc)) from None
        return _invalid(RecallArgumentError("expected_object", str(exc)),
                        alongside_visible_tool)
    except RecallArgumentError as exc:
        return _invalid(exc, alongside_visible_tool)
    refused = ctx.budget.admit(args)
    if refused is not None:
        raise RecallFailed("depth_exhausted", f"recall budget refused: {refused}")
    return args


def _invalid(exc: RecallArgumentError, alongside_visible_tool: bool) -> str:
    if alongside_visible_tool:
        raise RecallFailed("recall_execution", "invalid call alongside a visible tool") \
            from None
    return exc.tool_result()


async def run_recall(ctx: RecallContext, args: RecallArgs, protocol: str) -> RecallOutcome:
    """Run one admitted recall and account it: metrics, budget."""
    started = time.monotonic()
    outcome = await ctx.executor.run(args)
    metrics.record_recall(protocol, len(outcome.coverage), time.monotonic() - started,
                          ok=not outcome.failed)
    if outcome.failure is not None:
        log.warning("recall failed category=%s; the model answers without it", outcome.failure)
    ctx.budget.record(outcome.text, outcome.coverage)
    return outcome


async def execute_recall(ctx: RecallContext, call: RecallCall, protocol: str, *,
                         alongside_visible_tool: bool = False,
                         strict_frames: bool = False) -> ExecutedRecall:
    """Admit, run and account one recall; the shared step of every protocol."""
    admitted = admit(ctx, call, alongside_visible_tool=alongside_visible_tool,
                     strict_frames=strict_frames)
    if isinstance(admitted, str):
        return ExecutedRecall(admitted, None, None)
    outcome = await run_recall(ctx, admitted, protocol)
    anchor = new_anchor_id()
    return ExecutedRecall(ctx.budget.result_for_model(outcome.text),
                          anchored_marker(visible_marker(admitted), anchor), anchor)


async def send_counted(ctx: RecallContext, protocol: str, body: dict[str, Any], *,
                       stream: bool) -> StreamedFollowUp | JSONFollowUp:
    """``send_follow_up`` with the follow-up metrics: one count per request sent,
    one failure count (by C.7 category) per request that did not answer."""
    if ctx.fit is not None:
        body = await ctx.fit.before(body)
    metrics.record_followup(protocol)
    try:
        return await send_follow_up(ctx.upstream, ctx.url, ctx.headers, body, stream=stream,
                                    flag=ctx.stream_flag)
    except FollowUpError as exc:
        metrics.record_followup_failure(protocol, exc.category)
        retry = None
        if ctx.fit is not None and exc.status is not None:
            retry = await ctx.fit.after_refusal(body, exc.status, exc.body)
        if retry is None:
            raise
    # Refused as too long: once more, re-planned at a higher layer.
    metrics.record_followup(protocol)
    try:
        return await send_follow_up(ctx.upstream, ctx.url, ctx.headers, retry, stream=stream,
                                    flag=ctx.stream_flag)
    except FollowUpError as exc:
        metrics.record_followup_failure(protocol, exc.category)
        raise


async def with_keepalive(client: ClientWriter, work: Awaitable[T], frame: bytes,
                         every: float) -> T:
    """Await ``work`` while writing ``frame`` to the client every ``every`` seconds,
    so a recall and a slow follow-up do not look like a dead connection.

    The first beat is a timer, and the task that writes beats exists only once it
    fires: work that ends sooner (nearly every recall and follow-up) costs no task
    and no await on the way out. Under load each hand-off between tasks waits a
    whole loop iteration (150-400 ms at 200 clients on 2 CPUs), and waiting for a
    cancelled beat task cost one per recall and one per follow-up.
    """
    loop = asyncio.get_running_loop()
    beater: asyncio.Task[None] | None = None

    async def beat() -> None:
        while True:
            await client.write(frame)
            await asyncio.sleep(every)

    def first_beat() -> None:
        nonlocal beater
        beater = loop.create_task(beat())

    timer = loop.call_later(every, first_beat)
    try:
        return await work
    finally:
        timer.cancel()
        if beater is not None:
            beater.cancel()
            # gather, not a suppressed await: a cancel of this task still ends it.
            await asyncio.gather(beater, return_exceptions=True)


def final_round_result(result: str) -> str:
    """A tool result that also tells the model to answer without recalling again."""
    return result if FINAL_ROUND_TEXT in result else f"{result}\n\n{FINAL_ROUND_TEXT}"


def failure_category(exc: Exception) -> str:
    """The category a chain failure carries (``RecallFailed``, ``FollowUpError``);
    another exception's class name."""
    if isinstance(exc, (RecallFailed, FollowUpError)):
        return exc.category
    return type(exc).__name__


def stream_failure_message(exc: Exception) -> str:
    """What a streaming client is told: a hit limit by name, else the spec's line
    with the reason."""
    if isinstance(exc, StateLimitExceeded):
        return f"Lore stopped the response: {exc}; raise LORE_RECALL_RETAINED_MAX_BYTES"
    upstream = isinstance(exc, ProtocolError) or failure_category(exc) in UPSTREAM_FAILURES
    return with_reason(STREAM_RECALL_FAILED, str(exc) if upstream else None)


def transport_reason(exc: Exception) -> str:
    """Why reading an upstream body failed, in the words the plain relay uses."""
    if isinstance(exc, UpstreamBroken):
        return f"the upstream connection broke mid-response ({exc})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def with_reason(text: str, reason: str | None) -> str:
    """``text: reason``, so the client sees why (issue 15) after the spec's fixed
    words; the reason is the gateway's own wording of an upstream failure, never a
    header, and is redacted anyway as a last line of defence."""
    if not reason:
        return text
    from lore_gateway.memory.store.sanitize import redact_credentials

    return f"{text}: {redact_credentials(reason)}"


def event_object(event: SSEEvent, *, malformed: str, not_object: str) -> dict[str, Any]:
    """An event's JSON object payload; ``ProtocolError`` with the protocol's exact
    lore-spec message when it is not JSON (``malformed``) or not an object."""
    try:
        payload = orjson.loads(event.data)
    except orjson.JSONDecodeError:
        raise ProtocolError(malformed) from None
    if not isinstance(payload, dict):
        raise ProtocolError(not_object)
    return payload


async def read_json_principal(resp: UpstreamResponse) -> dict[str, Any]:
    """Read a non-stream principal answer: one JSON object, bounded."""
    body, cut = await resp.read(MAX_JSON_BYTES)
    if cut:
        raise ProtocolError(f"foreground response exceeded {MAX_JSON_BYTES} byte limit")
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ProtocolError("upstream response is not valid JSON") from None
    if not isinstance(payload, dict):
        raise ProtocolError("upstream response is not a JSON object")
    return payload
