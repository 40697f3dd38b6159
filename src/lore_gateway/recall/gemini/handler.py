"""Gemini ``generateContent`` on the recall chain (lore-spec C.2, C.3): the two
adapters the core drivers (:mod:`~lore_gateway.recall.core.driver`) run, and
the entry points the service calls.

Gemini names the stream flag in the URL, not in the body: the client's
``:streamGenerateContent?alt=sse`` streams, ``:generateContent`` answers with
one JSON object, and the API refuses a body with a ``stream`` field. So the
follow-up goes through ``followup.send_follow_up`` with :func:`stream_flag`,
which writes the client's own flag into the method of the URL: a streaming
client gets a streamed follow-up relayed live through
:class:`~lore_gateway.recall.gemini.live.GeminiRecallStream`, a non-streaming
client a ``:generateContent`` follow-up read as JSON.

The follow-up pair: the model's content up to and including the ``recall``
function call (thought parts and their signatures replayed as they came), then
a user content with its ``functionResponse``. Failure semantics are the chain
machine's: one recovery attempt, then 502 "Recall continuation failed"
(non-streaming) or an error record and no ``finishReason`` (streaming).
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.gemini_stream import usage_from_gemini
from lore_gateway.recall.chat.live import marker_content
from lore_gateway.recall.core import driver
from lore_gateway.recall.core.chain import (
    ExecutedRecall,
    RecallCall,
    RecallContext,
    final_round_result,
)
from lore_gateway.recall.core.machine import Round
from lore_gateway.recall.core.tool import RECALL_TOOL_NAME
from lore_gateway.recall.gemini.live import (
    KEEPALIVE,
    GeminiRecallStream,
    answer_parts,
    content_usable,
    is_recall_part,
    recall_calls,
    sum_usage,
    visible_text,
)
from lore_gateway.upstream import UpstreamResponse

log = logging.getLogger("lore.recall")

_PROTOCOL = "gemini"
HISTORY_KEY = "contents"
_STREAM_METHOD, _JSON_METHOD = "streamGenerateContent", "generateContent"


def stream_flag(url: str, body: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any]]:
    """The follow-up's URL with the client's stream flag as Gemini says it: the
    method ``:streamGenerateContent?alt=sse`` or ``:generateContent`` (the rest
    of the query, a ``key=`` among it, kept); the body is sent as it is."""
    parts = urlsplit(url)
    base, colon, _method = parts.path.rpartition(":")
    if not colon:
        raise ValueError(f"not a Gemini method URL: {parts.path}")
    query = [q for q in parts.query.split("&") if q and not q.startswith("alt=")]
    if stream:
        query.append("alt=sse")
    path = f"{base}:{_STREAM_METHOD if stream else _JSON_METHOD}"
    return urlunsplit((parts.scheme, parts.netloc, path, "&".join(query), "")), body


# --- Gemini content shapes --------------------------------------------------------


def follow_up_pair(parts: list[dict[str, Any]], call: RecallCall,
                   result: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model content (every part the model produced up to and including the
    recall call) and the user content with the call's ``functionResponse``."""
    model = {"role": "model", "parts": parts[:call.position + 1]}
    response: dict[str, Any] = {"name": RECALL_TOOL_NAME, "response": {"output": result}}
    if call.tool_use_id:
        response = {"id": call.tool_use_id, **response}
    return model, {"role": "user", "parts": [{"functionResponse": response}]}


def recovery_contents(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The follow-up once more, telling the model to answer without recall."""
    last = contents[-1]
    part = last["parts"][0]
    response = part["functionResponse"]
    output = str(response["response"]["output"])
    retold = {**response, "response": {"output": final_round_result(output)}}
    return [*contents[:-1], {**last, "parts": [{**part, "functionResponse": retold}]}]


def check_response(body: dict[str, Any]) -> dict[str, Any]:
    """A whole ``GenerateContentResponse``: one candidate that finished, or a
    prompt the API blocked (no candidate, a ``promptFeedback``)."""
    candidates = body.get("candidates")
    if candidates is None and isinstance(body.get("promptFeedback"), dict):
        return body
    if (not isinstance(candidates, list) or len(candidates) != 1
            or not isinstance(candidates[0], dict) or not candidates[0].get("finishReason")):
        raise ProtocolError("upstream Gemini request did not complete")
    return body


def _finish_reason(body: dict[str, Any]) -> Any:
    candidates = body.get("candidates")
    return candidates[0].get("finishReason") if candidates else None


def _visible_empty(parts: list[dict[str, Any]]) -> bool:
    return not content_usable(None, [p for p in parts if not is_recall_part(p)])


def _report_empty(ctx: RecallContext, parts: list[dict[str, Any]], model: Any,
                  finish: Any, usage: dict[str, Any]) -> None:
    ctx.check_empty(_PROTOCOL, _visible_empty(parts), model, finish,
                    usage.get("candidatesTokenCount"))


class _Contents(driver.MessagesFollowUps):
    """Follow-ups whose history is the request's ``contents``."""

    label, history_key, recovery = _PROTOCOL, HISTORY_KEY, staticmethod(recovery_contents)


# --- streaming client ---------------------------------------------------------------


class StreamAdapter(_Contents, driver.MessagesStream):
    """A Gemini client's live stream on the chain: one answer throughout."""

    keepalive = KEEPALIVE

    def __init__(self, ctx: RecallContext) -> None:
        self.stream = GeminiRecallStream(max_state_bytes=ctx.retained_bytes)
        driver.MessagesStream.__init__(self, ctx, self.stream)

    def recalled(self, executed: ExecutedRecall, *, mixed: bool) -> tuple[
            bytes, dict[str, Any], dict[str, Any]]:
        rnd = self.stream.round
        model, response = follow_up_pair(rnd.parts(), rnd.recalls[0], executed.result)
        shown = b"" if mixed else self.stream.close_preamble()
        if executed.marker is not None:
            shown += self.stream.marker_record(executed.marker)
        if not mixed:
            # The client runs no tool of its own: the answer goes on upstream.
            self.messages = [*self.messages, model, response]
            self.stream.begin_continuation()
        return shown, model, response

    def error_frame(self, message: str) -> bytes:
        return b"data: " + orjson.dumps({"error": {
            "code": 502, "message": message, "status": "UNAVAILABLE"}}) + b"\r\n\r\n"

    def report_empty(self, ctx: RecallContext) -> None:
        last = self.stream.round
        body = last.acc.response_body()
        _report_empty(ctx, last.parts(), body.get("modelVersion"), last.finish_reason(),
                      last.usage())


async def stream_recall(ctx: RecallContext, principal: UpstreamResponse,
                        client: driver.ClientStream,
                        response_headers: list[tuple[bytes, bytes]]) -> driver.OneRound | None:
    """Relay a streamed Gemini principal to a streaming client, running hidden
    recalls and splicing in their continuations; the answer's usage when it went
    out in one round as it came (else None)."""
    adapter = StreamAdapter(ctx)
    if not await driver.serve_stream(ctx, adapter, principal, client, response_headers):
        return None
    rounds = adapter.stream.rounds
    if len(rounds) > 1 or rounds[0].recall_seen or rounds[0].error is not None:
        return None
    usage = rounds[0].usage()
    return driver.OneRound(usage_from_gemini(usage) if usage else None)


# --- non-streaming client -------------------------------------------------------------


class BufferedAdapter(_Contents):
    """A non-streaming Gemini client's whole answers on the chain."""

    strict_frames = False

    def __init__(self, ctx: RecallContext) -> None:
        self.messages: list[dict[str, Any]] = list(ctx.body.get(HISTORY_KEY) or [])
        self.shown: list[dict[str, Any]] = []  # parts the client gets from earlier rounds
        self.usages: list[dict[str, Any]] = []
        self.answer: dict[str, Any] = {}
        self.recalls: list[RecallCall] = []

    def round(self, answer: dict[str, Any]) -> Round:
        self.answer = check_response(answer)
        usage = answer.get("usageMetadata")
        self.usages.append(usage if isinstance(usage, dict) else {})
        parts = answer_parts(answer)
        self.recalls, visible = recall_calls(parts)
        return Round(len(self.recalls), visible, content_usable(_finish_reason(answer), parts))

    def call(self) -> RecallCall:
        return self.recalls[0]

    def recalled(self, executed: ExecutedRecall) -> tuple[dict[str, Any], dict[str, Any]]:
        call, parts = self.recalls[0], answer_parts(self.answer)
        model, response = follow_up_pair(parts, call, executed.result)
        shown = [p for i, p in enumerate(parts) if i != call.position]
        if executed.marker is not None:
            before = visible_text([*self.shown, *parts[:call.position]])
            shown.insert(call.position, {"text": marker_content(before, executed.marker)})
        self.shown += shown
        self.messages = [*self.messages, model, response]
        return model, response

    def delivered(self, answer: dict[str, Any], *, mixed: bool) -> dict[str, Any]:
        if len(self.usages) == 1 and not self.recalls:
            return answer  # no recall: the upstream's body as it came
        last = self.answer
        parts = self.shown if mixed else self.shown + answer_parts(last)
        candidate = last["candidates"][0]
        content = {**(candidate.get("content") or {"role": "model"}), "parts": parts}
        usage = dict(last.get("usageMetadata") or {})
        usage.update(sum_usage(self.usages))
        return {**last, "candidates": [{**candidate, "content": content}],
                "usageMetadata": usage}

    def report_empty(self, ctx: RecallContext, body: dict[str, Any]) -> None:
        _report_empty(ctx, answer_parts(body), body.get("modelVersion"), _finish_reason(body),
                      body.get("usageMetadata") or {})


async def buffered_recall(ctx: RecallContext, principal: dict[str, Any]) -> tuple[
        int, bytes, list[tuple[bytes, bytes]]]:
    """The buffered loop (C.3) for a non-streaming Gemini client. Returns the
    status, body and extra headers the client gets."""
    return await driver.serve_json(ctx, BufferedAdapter(ctx), principal)


__all__ = ["BufferedAdapter", "StreamAdapter", "buffered_recall", "stream_flag",
           "stream_recall"]
