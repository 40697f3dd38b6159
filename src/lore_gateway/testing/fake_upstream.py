"""A scripted fake provider on 127.0.0.1 for tests and benchmarks.

It speaks the five upstream shapes the gateway forwards to (OpenAI Responses,
the ChatGPT Codex backend, Chat Completions, Anthropic Messages, and Gemini
``generateContent``, ``fake_gemini.py``), records every
request it receives, and misbehaves on demand. Tests pick the behaviour of one
request with the ``x-fake-scenario`` header, or for the next requests with
:meth:`FakeUpstream.script`, or for all of them with ``default_scenario``.

Scenarios (``name`` or ``name:argument``): see ``fake_scenarios.py`` and
docs/testing.md.

``reported_input_tokens`` makes every agent answer report that many input tokens
(an agent's context passes its compaction threshold without huge bodies), and
the Codex compaction flows (``…/responses/compact``, a ``compaction_trigger``
item) are answered as the OpenAI backend does (``fake_compaction.py``).

:meth:`FakeUpstream.script_rate_limits` starts the next Responses streams with a
``codex.rate_limits`` frame (before ``response.created``, as the Codex backend does).

Strict mode (``strict=True``, the default) answers a model request the real API
would refuse with that API's own status and error body, before any scenario
runs: tool calls and results that do not pair, thinking blocks that do not start
a tool loop's final turn or whose signature the fake did not make, more than
four cache breakpoints or a 1h one after a 5m one, reasoning or compaction
content the fake did not seal (the gateway's ``lore-compaction:`` handle
included), duplicate items, and a body past the context window (bytes / 4
against ``window``, or the model's window; a worker request always meets its
own model's). See ``strict.py`` for every rule.
Each refusal is kept in ``refusals`` as ``(path, Refusal)``, so a test can
assert that the gateway sent nothing a provider would refuse. Only a test of
how the gateway relays a client's invalid input sets ``fake.strict = False``.

Requests carrying ``x-lore-worker: <job>`` (the gateway's background worker)
take ``worker_scenario`` instead (default ``worker``: the scripted worker model
of ``fake_worker.py``; any scenario above works too, e.g. ``stall``), so
scripts for agent traffic are never consumed by background calls.
:meth:`FakeUpstream.hold_worker` keeps one kind of worker request (``curate``)
unanswered until the test releases it, so a background job stays in flight
while the test does something else.

``metered=True`` reports usage like a caching provider: input tokens are the
body's bytes / 4, and the bytes shared with the previous model request count as
cache reads (Anthropic ``cache_read_input_tokens``, OpenAI ``cached_tokens``);
``window`` then answers a larger request with the provider's context-length
error. ``metered_log`` keeps (input tokens, cached tokens) per answer.

``x-fake-replay: <file>`` replays a recorded fixture byte for byte instead
(scripted as ``replay:<file>``: SSE even to a ``stream:false`` request).

Run standalone for benchmarks: ``python -m lore_gateway.testing.fake_upstream
--port 18081 --events 41``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import socket
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from lore_gateway.testing import (
    fake_compaction,
    fake_delivery,
    fake_gemini,
    fake_gemini_route,
    fake_worker,
)
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing import strict as strict_rules
from lore_gateway.testing.fake_delivery import JSON_TYPE, RecordedRequest
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN, common_prefix, metered
from lore_gateway.testing.fake_scenarios import Scenario, canned
from lore_gateway.testing.fake_streams import Answer
from lore_gateway.testing.fake_wire import (
    ACCOUNTS,
    BIG_DELTA_BYTES,
    USAGE,
    bench_text,
    big_stream,
    decode_body,
    error_body,
    fresh_ids,
    model_of,
    reply_headers,
)

# Recorded requests kept for inspection. A test sends a handful; the bound only
# matters for a long benchmark, which records nothing (``max_recorded=0``).
DEFAULT_MAX_RECORDED = 10_000
# Scripted scenarios waiting for the next requests.
MAX_SCRIPT = 1_000
# Strict-mode refusals remembered; a test expects none, or a few it provoked.
MAX_REFUSALS = 1_000
# Metered answers remembered for inspection (a long benchmark reads them per turn).
MAX_METERED = 100_000
# How often a held worker request looks whether the test released it.
HOLD_POLL_S = 0.02

_Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]



class _NoDelayServer(web.Server):
    """aiohttp's low-level server, with TCP_NODELAY set on every accepted socket.

    Small SSE frames otherwise wait for the peer's delayed ACK (Nagle), about
    40 ms per request, which would swamp any latency the gateway adds.
    """

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(handler, transport)


class FakeUpstream:
    """The fake provider. ``await start()``, use ``url``, ``await stop()``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        text: str = fs.DEFAULT_TEXT,
        deltas: int | None = None,
        fixtures_dir: Path | None = None,
        max_recorded: int = DEFAULT_MAX_RECORDED,
        metered: bool = False,
        window: int | None = None,
        strict: bool = True,
    ) -> None:
        self.metered = metered
        self.window = window
        # Refuse what the real APIs refuse (strict.py); see the module docstring.
        self.strict = strict
        self.refusals: deque[tuple[str, strict_rules.Refusal]] = deque(maxlen=MAX_REFUSALS)
        self.metered_log: deque[tuple[int, int]] = deque(maxlen=MAX_METERED)
        self._last_body = b""
        self.host = host
        self.port = port
        self.text = text
        self.deltas = deltas
        self.fixtures_dir = fixtures_dir
        self.default_scenario = "text"
        self.worker_scenario = "worker"
        # Models this fake answers 404 for, as a backend that does not offer them.
        self.unknown_models: set[str] = set()
        # Input tokens every agent answer reports (None: the canned small figure).
        self.reported_input_tokens: int | None = None
        self._records: deque[RecordedRequest] = deque(maxlen=max_recorded)
        self._script: deque[str] = deque(maxlen=MAX_SCRIPT)
        self._rate_limits: deque[float | None] = deque(maxlen=MAX_SCRIPT)
        self._worker_holds: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: _NoDelayServer | None = None
        self._listener: asyncio.base_events.Server | None = None
        self._routes: dict[tuple[str, str], _Handler] = {
            ("POST", "/v1/responses"): self._model("responses"),
            ("POST", "/backend-api/codex/responses"): self._model("codex"),
            ("POST", "/v1/chat/completions"): self._model("chat"),
            ("POST", "/v1/messages"): self._model("anthropic"),
            ("POST", "/v1/responses/compact"): self._compact,
            ("POST", "/backend-api/codex/responses/compact"): self._compact,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("GET", "/v1/models"): self._models,
            ("HEAD", "/"): self._root,
            ("GET", "/"): self._root,
            ("GET", "/backend-api/wham/accounts/check"): self._static(ACCOUNTS),
            ("GET", "/backend-api/codex/models"): self._static({"models": []}),
            ("GET", "/backend-api/wham/settings/user"): self._static({}),
            ("GET", "/backend-api/wham/usage"): self._static(USAGE),
        }

    # ------------------------------------------------------------------ control

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every recorded request, oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def model_requests(self) -> list[RecordedRequest]:
        """The recorded POSTs, i.e. model calls and token counts."""
        return [r for r in self.requests if r.method == "POST"]

    def script(self, scenarios: Iterable[str]) -> None:
        """Serve these scenarios to the next model requests, in order."""
        with self._lock:
            self._script.extend(scenarios)

    def script_rate_limits(self, used_percents: Iterable[float | None]) -> None:
        """Begin each of the next streamed Responses answers with a ``codex.rate_limits``
        frame carrying that ``used_percent`` (None: no frame for that answer)."""
        with self._lock:
            self._rate_limits.extend(used_percents)

    def hold_worker(self, job: str) -> threading.Event:
        """Hold the worker's ``job`` requests (``x-lore-worker: <job>``) once recorded,
        unanswered until the returned event is set."""
        gate = threading.Event()
        with self._lock:
            self._worker_holds[job] = gate
        return gate

    def reset(self) -> None:
        """Forget recorded requests and pending scripts; back to ``text``."""
        with self._lock:
            for gate in self._worker_holds.values():
                gate.set()
            self._worker_holds.clear()
            self._records.clear()
            self._script.clear()
            self._rate_limits.clear()
        self.default_scenario = "text"
        self.worker_scenario = "worker"
        self.unknown_models.clear()
        self.reported_input_tokens = None
        self.metered = False
        self.window = None
        self.strict = True
        self.refusals.clear()
        self.metered_log.clear()
        self._last_body = b""

    async def start(self) -> None:
        # auto_decompress=False: bodies are recorded as sent and decoded here,
        # zstd included (aiohttp would need an extra package for it).
        self._server = _NoDelayServer(
            self._handle, handler_cancellation=True, access_log=None, auto_decompress=False
        )
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(self._server, self.host, self.port)
        self.port = self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(1.0)
        if self._listener is not None:
            await self._listener.wait_closed()
        self._listener = self._server = None

    # ------------------------------------------------------------------ dispatch

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return web.json_response(
                {"error": {"message": "WebSocket is not supported here; use HTTP."}},
                status=426, headers={"Connection": "close"},
            )
        gemini = fake_gemini.gemini_method(request.method, request.path)
        if gemini is not None:
            return await fake_gemini_route.serve(self, request, *gemini)
        listing, name = fake_gemini.model_path(request.method, request.path)
        if listing and (name is not None or request.path.startswith("/v1beta/")
                        or "x-goog-api-key" in request.headers):
            await self.record(request)
            return web.Response(body=fake_gemini.models_body(name), content_type=JSON_TYPE)
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            await self.record(request)
            message = f"No route for {request.method} {request.path}"
            return web.json_response(
                {"type": "error", "error": {"type": "not_found", "message": message}}, status=404
            )
        return await handler(request)

    async def record(self, request: web.BaseRequest, scenario: str = "") -> RecordedRequest:
        """Record ``request`` (its body decoded) under ``scenario``."""
        raw = await request.read()
        body = decode_body(raw, request.headers.get("Content-Encoding", ""))
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        record = RecordedRequest(
            method=request.method,
            path=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            raw_body=raw,
            json=parsed,
            scenario=scenario,
        )
        with self._lock:
            self._records.append(record)
        return record

    def next_scenario(self, request: web.BaseRequest) -> str:
        """The scenario this request gets: a worker's, its header's, the script's."""
        if "x-lore-worker" in request.headers:
            return self.worker_scenario
        header = request.headers.get("x-fake-scenario")
        if header:
            return header
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self.default_scenario

    async def worker_hold(self, job: str | None) -> None:
        """Wait while a test holds this kind of worker request (``hold_worker``)."""
        with self._lock:
            gate = self._worker_holds.get(job) if job else None
        while gate is not None:  # a threading.Event, set from the test's thread
            if gate.is_set():
                return
            await asyncio.sleep(HOLD_POLL_S)

    def _static(self, payload: Any) -> _Handler:
        body = orjson.dumps(payload)

        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            await self.record(request)
            return web.Response(body=body, content_type=JSON_TYPE)

        return handler

    async def _root(self, request: web.BaseRequest) -> web.StreamResponse:
        await self.record(request)
        return web.Response(status=200)

    async def _models(self, request: web.BaseRequest) -> web.StreamResponse:
        await self.record(request)
        payload = models_listing(anthropic="anthropic-version" in request.headers)
        return web.Response(body=orjson.dumps(payload), content_type=JSON_TYPE)

    async def _count_tokens(self, request: web.BaseRequest) -> web.StreamResponse:
        record = await self.record(request)
        if record.json is None:
            return web.Response(status=400, body=error_body("anthropic", 400, "invalid JSON body"),
                                content_type=JSON_TYPE)
        return web.json_response({"input_tokens": max(1, len(record.body) // 4)})

    async def _compact(self, request: web.BaseRequest) -> web.StreamResponse:
        record = await self.record(request, "compact")
        shape = "codex" if record.route.startswith("/backend-api/") else "responses"
        refusal = self._refusal(shape, record) if isinstance(record.json, dict) else None
        if refusal is not None:  # the compact endpoint validates its input like /responses
            return web.Response(status=refusal.status, body=refusal.body,
                                content_type=JSON_TYPE)
        return web.Response(body=fake_compaction.compact_body(model_of(record.json, "gpt-fake")),
                            content_type=JSON_TYPE)

    def _model(self, shape: str) -> _Handler:
        async def handler(request: web.BaseRequest) -> web.StreamResponse:
            return await self._answer(request, shape)

        return handler

    # ------------------------------------------------------------------ model calls

    async def _answer(self, request: web.BaseRequest, shape: str) -> web.StreamResponse:
        replay = request.headers.get("x-fake-replay")
        spec = f"replay:{replay}" if replay else self.next_scenario(request)
        if spec.startswith("replay:"):  # also scriptable, whatever the stream flag
            replay = spec.removeprefix("replay:")
        record = await self.record(request, spec)
        headers = reply_headers(shape, f"req_fake_{next(self._ids)}")
        body = record.json
        if not isinstance(body, dict):
            message = "We could not parse the JSON body of your request."
            return self._error(shape, 400, message, headers)
        detail = codex_refusal(body) if shape == "codex" else None
        if detail is not None:
            return web.Response(status=400, body=detail, content_type=JSON_TYPE, headers=headers)
        if body.get("model") in self.unknown_models:
            return self._error(shape, 404, f"The model {body['model']} does not exist", headers)
        refusal = self._refusal(shape, record)
        if refusal is not None:
            return web.Response(status=refusal.status, body=refusal.body,
                                content_type=JSON_TYPE, headers=headers)
        if replay:
            return await fake_delivery.replay(request, record, replay, headers,
                                               self.fixtures_dir)
        scenario = Scenario.parse(spec)
        await self.worker_hold(record.headers.get("x-lore-worker"))
        if scenario.name == "worker":
            job = record.headers.get("x-lore-worker", "")
            scenario = Scenario("text", fake_worker.answer(job, body))
        stream = body.get("stream") is True
        if scenario.name == "too-long":
            return self._error(shape, 400, fake_compaction.TOO_LONG[shape == "anthropic"],
                               headers)
        if scenario.name.startswith("status-"):
            code = int(scenario.name.removeprefix("status-"))
            headers |= {"retry-after": "7"}
            return self._error(shape, code, f"fake upstream error {code}", headers)
        if scenario.name == "big-stream":
            size, _, delta = (scenario.arg or "1").partition("@")
            frames = big_stream(shape, model_of(body, "fake"), int(float(size) * 1024 * 1024),
                                 int(delta or BIG_DELTA_BYTES))
            return await fake_delivery.stream(request, record, frames, headers)
        if scenario.name == "slow":
            await asyncio.sleep(float(scenario.arg or "1"))
        answer = canned(shape, scenario, body, self.text, self.deltas)
        if shape in ("responses", "codex") and fake_compaction.is_compaction_trigger(body):
            answer = fake_compaction.compaction_answer(model_of(body, "gpt-fake"))
        answer = fresh_ids(answer, record.body)
        if self.reported_input_tokens is not None and "x-lore-worker" not in record.headers:
            api = shape if shape in ("anthropic", "chat") else "responses"
            answer = fake_compaction.with_input_tokens(answer, api, self.reported_input_tokens)
        if self.metered and "x-lore-worker" in record.headers:
            answer = metered(answer, shape, len(record.body) // BYTES_PER_TOKEN, 0)
        elif self.metered:
            answer = metered(answer, shape, *self.meter(record.body))
        if not stream:
            return web.Response(body=answer.body, content_type=JSON_TYPE, headers=headers)
        if shape in ("responses", "codex"):
            with self._lock:
                percent = self._rate_limits.popleft() if self._rate_limits else None
            if percent is not None:
                answer = Answer((fs.codex_rate_limits_frame(percent), *answer.frames),
                                answer.body)
        return await fake_delivery.misbehave(request, record, scenario, shape, answer, headers)

    def meter(self, body: bytes) -> tuple[int, int]:
        """Metered mode: this request's input tokens and those a prompt cache would
        read (the prefix shared with the previous request), logged."""
        tokens = len(body) // BYTES_PER_TOKEN
        cached = common_prefix(self._last_body, body) // BYTES_PER_TOKEN
        self._last_body = body
        self.metered_log.append((tokens, cached))
        return tokens, cached

    def _refusal(self, shape: str, record: RecordedRequest) -> strict_rules.Refusal | None:
        """What the real API would refuse this request with (strict mode), recorded; with
        strict mode off, only a metered window still answers a request past it."""
        if not self.strict:
            if self.metered and self.window is not None and "x-lore-worker" not in record.headers:
                return strict_rules.check_window(shape, record.body, self.window)
            return None
        model = model_of(record.json, "")
        # ``window`` plays the agent model's window; a worker request goes to its
        # own (small, large-window) model, so it meets that model's window.
        worker = "x-lore-worker" in record.headers
        window = (None if worker else self.window) or strict_rules.window_for_model(model)
        refusal = strict_rules.check(shape, record.json, record.body, window=window)
        if refusal is not None:
            self.refused(record, refusal)
        return refusal

    def refused(self, record: RecordedRequest, refusal: strict_rules.Refusal) -> None:
        """Keep what the real API would have refused this request with."""
        with self._lock:
            self.refusals.append((record.path, refusal))

    def _error(
        self, shape: str, status: int, message: str, headers: dict[str, str]
    ) -> web.Response:
        return web.Response(status=status, body=error_body(shape, status, message),
                            content_type=JSON_TYPE, headers=headers)


def models_listing(*, anthropic: bool) -> dict[str, Any]:
    """``GET /v1/models`` as Anthropic's API or OpenAI's answers it."""
    if anthropic:
        model = {"type": "model", "id": "claude-fake", "display_name": "Claude Fake",
                 "created_at": "2026-11-30T00:00:00Z"}
        return {"data": [model], "has_more": False, "first_id": "claude-fake",
                "last_id": "claude-fake"}
    return {"object": "list", "data": [
        {"id": "gpt-fake", "object": "model", "created": fs.CREATED_AT, "owned_by": "fake"}]}


def codex_refusal(body: dict[str, Any]) -> bytes | None:
    """The ChatGPT Codex backend's own rules, byte for byte where known: the body
    it answers a request it refuses with (400)."""
    if body.get("stream") is not True:
        return b'{"detail":"Stream must be set to true"}'
    if "max_output_tokens" in body:
        return b'{"detail":"Unsupported parameter: max_output_tokens"}'
    return None


async def _serve(args: argparse.Namespace) -> None:
    fake = FakeUpstream(
        host=args.host, port=args.port, text=bench_text(args.events),
        deltas=max(1, args.events - 8), max_recorded=0,
    )
    await fake.start()
    print(f"fake upstream listening on {fake.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run the scripted fake provider on loopback.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--events", type=int, default=41,
                        help="frames in a streamed Responses text answer (default 41)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
