"""The fake provider's Gemini model methods (``FakeUpstream``'s route for them):
countTokens, and answers under the API's rules as JSON, SSE (``alt=sse``) or a
streamed JSON array. The answers themselves are :mod:`fake_gemini`'s (pure)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from lore_gateway.testing import fake_delivery, fake_gemini, fake_worker
from lore_gateway.testing import strict as strict_rules
from lore_gateway.testing.fake_delivery import JSON_TYPE
from lore_gateway.testing.fake_scenarios import Scenario
from lore_gateway.testing.fake_streams import Answer

if TYPE_CHECKING:
    from lore_gateway.testing.fake_upstream import FakeUpstream


async def serve(fake: FakeUpstream, request: web.BaseRequest, model: str,
                method: str) -> web.StreamResponse:
    """A Gemini model method (``fake_gemini``): countTokens, or an answer with
    the API's rules, as JSON, SSE (``alt=sse``) or a streamed JSON array."""
    if method not in fake_gemini.GENERATE:
        record = await fake.record(request)
        return web.Response(body=fake_gemini.count_tokens_body(record.body),
                            content_type=JSON_TYPE)
    spec = fake.next_scenario(request)
    record = await fake.record(request, spec)
    stream = method == "streamGenerateContent"
    sse = request.query.get("alt") == "sse"
    headers = {} if sse or not stream else {"Content-Type": JSON_TYPE}

    def error(status: int, body: bytes, **extra: str) -> web.Response:
        # A streamed array answers its error as an array of one.
        wrapped = b"[" + body + b"]" if stream and not sse else body
        return web.Response(status=status, body=wrapped, content_type=JSON_TYPE,
                            headers=extra)

    body = record.json
    if not isinstance(body, dict):
        return error(400, fake_gemini.error_body(400, "Invalid JSON payload received."))
    if model in fake.unknown_models:
        return error(404, fake_gemini.error_body(
            404, f"models/{model} is not found for API version v1beta"))
    refusal = fake_gemini.check(body) if fake.strict else None
    window = fake.window or strict_rules.window_for_model(model)
    if refusal is None and (fake.strict or (fake.metered and fake.window is not None)):
        refusal = fake_gemini.check_window(record.body, window)
    if refusal is not None:
        fake.refused(record, refusal)
        return error(refusal.status, refusal.body)
    scenario = Scenario.parse(spec)
    await fake.worker_hold(record.headers.get("x-lore-worker"))
    if scenario.name == "worker":
        scenario = Scenario("text", fake_worker.answer(record.headers["x-lore-worker"], body))
    if scenario.name == "too-long":
        return error(400, fake_gemini.error_body(400, fake_gemini.TOO_LONG))
    if scenario.name.startswith("status-"):
        code = int(scenario.name.removeprefix("status-"))
        return error(code, fake_gemini.error_body(code, f"fake upstream error {code}"),
                     **{"retry-after": "7"})
    if scenario.name == "slow":
        await asyncio.sleep(float(scenario.arg or "1"))
    usage: dict[str, int] = {}
    if fake.reported_input_tokens is not None:
        usage["promptTokenCount"] = fake.reported_input_tokens
    if fake.metered:
        usage["promptTokenCount"], usage["cachedContentTokenCount"] = fake.meter(record.body)
    answer = fake_gemini.answer(scenario, body, model, fake.text, fake.deltas, usage)
    if not stream:
        return web.Response(body=orjson.dumps(answer.body), content_type=JSON_TYPE)
    records = answer.records
    if scenario.name == "failed":
        records = (*records[:-1], fake_gemini.error_record("fake failure"))
    frames = fake_gemini.frames(records, sse)
    return await fake_delivery.misbehave(request, record, scenario, "gemini",
                                         Answer(frames, b""), headers)
