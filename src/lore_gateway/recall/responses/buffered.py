"""Responses (public API and Codex backend) for a non-streaming client, on the
chain machine (lore-spec C.3, C.6).

The follow-up's stream flag is the Codex flag: the Codex backend only streams
(its SSE is accumulated with the one :class:`ResponsesAccumulator`), the public
API answers ``stream:false`` as JSON. A recovery answer is a second attempt at
the turn: it must not repeat what the client already has, and its ids are made
fresh (``recovery.FreshIds``).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from lore_gateway.errors import error_body
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.responses_stream import ResponsesAccumulator
from lore_gateway.protocols.usage import (
    Usage,
    merge_usage,
    usage_from_responses,
    usage_to_responses,
)
from lore_gateway.recall.core import driver
from lore_gateway.recall.core.budget import FINAL_ROUND_TEXT
from lore_gateway.recall.core.chain import (
    RECALL_FAILED,
    RECALL_INVOKED_HEADER,
    ExecutedRecall,
    RecallCall,
    RecallContext,
    RecallFailed,
    send_counted,
)
from lore_gateway.recall.core.followup import JSONFollowUp
from lore_gateway.recall.core.machine import Round
from lore_gateway.recall.core.tool import is_recall_call
from lore_gateway.recall.responses.frames import marker_item
from lore_gateway.recall.responses.recovery import FreshIds, repeated_delivery

log = logging.getLogger("lore.recall")


def label(codex: bool) -> str:
    """The metrics' protocol label."""
    return "codex" if codex else "responses"


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


def recall_items(response: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    output = response.get("output") or []
    return [
        (i, item)
        for i, item in enumerate(output)
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and is_recall_call(item.get("name"))
    ]


def usable(response: dict[str, Any]) -> bool:
    """C.1 "usable continuation": text, a refusal or a visible tool call."""
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


def _usage(response: dict[str, Any]) -> Usage | None:
    raw = response.get("usage")
    if raw is None:
        return None
    try:
        return usage_from_responses(raw)
    except ProtocolError:
        return None


def _visible_tools(output: list[Any]) -> int:
    return sum(1 for i in output if isinstance(i, dict) and i.get("type") == "function_call"
               and not is_recall_call(i.get("name")))


class BufferedAdapter:
    """A non-streaming Responses client's whole answers on the chain."""

    strict_frames = True

    def __init__(self, ctx: RecallContext, principal: dict[str, Any], *, codex: bool) -> None:
        self.codex = codex
        self.label = label(codex)
        self.principal_id = principal.get("id")
        self.delivered_items: list[dict[str, Any]] = []  # what the client gets, so far
        self.extra: list[dict[str, Any]] = []  # what the follow-up appends to the input
        self.usage: Usage | None = None
        self.response: dict[str, Any] = {}
        self.recalls: list[tuple[int, dict[str, Any]]] = []

    def round(self, answer: dict[str, Any]) -> Round:
        self.response = answer
        self.usage = merge_usage(self.usage, _usage(answer))
        self.recalls = recall_items(answer)
        status = answer.get("status")
        complete, reason = True, ""
        if status in ("failed", "cancelled") or answer.get("error"):
            complete, reason = False, f"upstream Responses request ended with status {status}"
        elif self.recalls and status not in (None, "completed"):
            complete, reason = False, "incomplete recall principal cannot execute recall"
        return Round(len(self.recalls), _visible_tools(answer.get("output") or []),
                     usable(answer), complete, reason)

    def call(self) -> RecallCall:
        index, item = self.recalls[0]
        call_id = str(item.get("call_id") or item.get("id") or "")
        return RecallCall(call_id, str(item.get("arguments") or ""), index)

    def recalled(self, executed: ExecutedRecall) -> tuple[dict[str, Any], dict[str, Any]]:
        call = self.call()
        index = call.position
        output = list(self.response.get("output") or [])
        pair = ({"type": "function_call", "call_id": call.tool_use_id, "name": "recall",
                 "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.tool_use_id,
                 "output": executed.result})
        before = [i for j, i in enumerate(output) if j != index]
        public = len(self.delivered_items) + index
        marker = ([marker_item(self.principal_id, public, executed.anchor_id)]
                  if executed.anchor_id else [])
        self.delivered_items.extend(output[:index] + marker + output[index + 1:])
        self.extra.extend([*before, *pair])
        return pair

    async def follow_up(self, ctx: RecallContext, *, recovery: bool) -> dict[str, Any]:
        body = follow_up_body(ctx.body, self.extra, recovery=recovery)
        log.info("recall (non-stream, depth=%d, codex=%s): executing follow-up",
                 ctx.budget.executions, self.codex)
        result = await send_counted(ctx, self.label, body, stream=self.codex)
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
        return self._fresh(response) if recovery else response

    def _fresh(self, response: dict[str, Any]) -> dict[str, Any]:
        """A recovery answer: never a repeat of what the client has; fresh ids."""
        repeat = repeated_delivery(
            [i for i in response.get("output") or [] if isinstance(i, dict)], self.extra)
        if repeat is not None:
            raise RecallFailed("follow_up_failed", repeat)
        fresh = FreshIds()
        try:
            output = [fresh.item(i) if isinstance(i, dict) else i
                      for i in response.get("output") or []]
        except ProtocolError as exc:
            raise RecallFailed("resource_limit", str(exc)) from None
        return {**response, "output": output}

    def delivered(self, answer: dict[str, Any], *, mixed: bool) -> dict[str, Any]:
        out = dict(self.response)
        rest = [] if mixed else list(self.response.get("output") or [])
        out["output"] = self.delivered_items + rest
        if self.usage is not None:
            out["usage"] = usage_to_responses(self.usage)
        out["id"] = self.principal_id
        return out


async def buffered_responses_recall(
    ctx: RecallContext, principal: dict[str, Any], *, codex: bool
) -> tuple[int, list[tuple[bytes, bytes]], bytes, dict[str, Any] | None]:
    """Run the recall loop on a whole principal response. Returns status, extra
    headers, the client body, and the final response (None on failure). The
    caller calls ``ctx.delivered()`` once the client has read the body."""
    adapter = BufferedAdapter(ctx, principal, codex=codex)
    try:
        final = await driver.run_buffered(ctx, adapter, principal)
    except RecallFailed as exc:
        ctx.staged.clear()
        log.warning("recall (non-stream) failed category=%s: %s", exc.category, exc)
        return 502, [], error_body("server_error", RECALL_FAILED), None
    headers = [RECALL_INVOKED_HEADER] if ctx.staged or ctx.budget.executions else []
    return 200, headers, orjson.dumps(final), final
