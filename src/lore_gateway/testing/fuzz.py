"""The fuzz campaign: hypothesis strategies, a rig and the oracle, shared by the
test suite (``tests/reliability/test_fuzz.py``, a fixed budget in CI) and
``lore bench fuzz`` (as many cases as asked for).

Two targets:

- **client requests** on every route: bodies derived from valid requests of the
  route's protocol with fields replaced by arbitrary JSON, raw bytes, non-object
  JSON, deep nesting, broken or stacked compression, odd headers and paths. The
  provider behind the gateway always answers well, so anything but a complete
  2xx/4xx answer is the gateway's fault.
- **upstream streams**: a well-formed answer of each protocol (text or a recall
  call), then mutated: frames dropped, duplicated (terminal events included),
  garbled, renamed, events after the terminal, junk bytes, arbitrary chunking,
  a reset at the end, an error status. Requested with and without a tool (plain
  relay and recall mode), streamed and not.

The oracle: the gateway never answers 500, never raises into uvicorn (an
"Exception in ASGI application" log record), never logs an unexpected
exception, always stays healthy, and with a well-behaved provider never cuts a
response. Needs the dev extra (hypothesis).
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import zstandard
from hypothesis import strategies as st

from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.background import BackgroundServer
from lore_gateway.testing.fuzz_upstream import MODEL, FuzzUpstream, Plan

# Bounds that keep one case small and fast (a few ms through the gateway).
MAX_JSON_LEAVES = 12
MAX_CHUNKS = 40
HTTP_TIMEOUT_S = 30.0

KEY = "sk-fuzz-credential-0123456789abcdef"

ROUTES: dict[str, tuple[str, str]] = {
    # name: (path, protocol family of the request body)
    "responses": ("/v1/responses", "responses"),
    "codex": ("/backend-api/codex/responses", "responses"),
    "chat": ("/v1/chat/completions", "chat"),
    "anthropic": ("/v1/messages", "anthropic"),
    "count_tokens": ("/v1/messages/count_tokens", "anthropic"),
}

TOOLS = {
    "responses": [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
    "chat": [{"type": "function", "function": {"name": "read_file",
                                               "parameters": {"type": "object"}}}],
    "anthropic": [{"name": "read_file", "input_schema": {"type": "object"}}],
}


def base_request(api: str, *, stream: bool, tools: bool) -> dict[str, Any]:
    body: dict[str, Any]
    if api == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "fuzz question"}]}
    elif api == "anthropic":
        body = {"model": MODEL, "max_tokens": 32,
                "messages": [{"role": "user", "content": "fuzz question"}]}
    else:
        body = {"model": MODEL, "input": "fuzz question"}
    body["stream"] = stream
    if tools:
        body["tools"] = TOOLS[api]
    return body


# --- client requests ------------------------------------------------------------------

_text = st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=MAX_JSON_LEAVES,
)

_FIELDS = {
    "responses": ["input", "tools", "model", "stream", "instructions", "tool_choice",
                  "parallel_tool_calls", "store", "max_output_tokens", "previous_response_id"],
    "chat": ["messages", "tools", "model", "stream", "tool_choice", "stream_options", "n"],
    "anthropic": ["messages", "tools", "model", "stream", "system", "metadata", "tool_choice",
                  "max_tokens", "thinking"],
}


@dataclass(frozen=True, slots=True)
class ClientCase:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


@st.composite
def _message_field(draw: st.DrawFn, api: str) -> Any:
    """A plausible-but-wrong conversation: the shapes handlers walk."""
    item = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool", "system", "developer"])
         | json_values},
        optional={"content": json_values | st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(
                ["text", "input_text", "tool_result", "tool_use", "image", "output_text"])},
                optional={"text": json_values, "content": json_values, "id": json_values,
                          "input": json_values}), max_size=3),
                  "type": st.sampled_from(["message", "function_call_output", "function_call",
                                           "reasoning"]) | json_values,
                  "tool_calls": json_values, "output": json_values, "call_id": json_values},
    )
    return draw(st.lists(item, max_size=4) | json_values)


@st.composite
def _body(draw: st.DrawFn, api: str) -> bytes:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "nested", "raw", "scalar"]))
    if kind == "raw":
        return draw(st.binary(max_size=64))
    if kind == "scalar":
        return _dumps(draw(json_values))
    body = base_request(api, stream=draw(st.booleans()), tools=draw(st.booleans()))
    if kind == "nested":
        depth = draw(st.integers(min_value=200, max_value=1100))
        encoded = _dumps({**body, "extra": None})
        return encoded.replace(b'"extra":null', b'"extra":' + b"[" * depth + b"]" * depth)
    for name in draw(st.lists(st.sampled_from(_FIELDS[api]), max_size=3, unique=True)):
        if name in ("messages", "input") and draw(st.booleans()):
            body[name] = draw(_message_field(api))
        else:
            body[name] = draw(json_values)
    return _dumps(body)


def _dumps(value: Any) -> bytes:
    """JSON as a lenient client writes it: big integers, lone surrogates escaped."""
    return json.dumps(value, separators=(",", ":")).encode()


def _encode(draw: st.DrawFn, body: bytes) -> tuple[bytes, str | None]:
    coding = draw(st.sampled_from([None, None, None, "gzip", "zstd", "gzip-stacked",
                                   "zstd-frames", "garbage", "br", "deflate"]))
    if coding is None:
        return body, None
    half = len(body) // 2
    if coding == "gzip":
        return gzip.compress(body), "gzip"
    if coding == "gzip-stacked":
        return gzip.compress(body[:half]) + gzip.compress(body[half:]), "gzip"
    if coding == "zstd":
        return zstandard.ZstdCompressor().compress(body), "zstd"
    if coding == "zstd-frames":
        z = zstandard.ZstdCompressor()
        return z.compress(body[:half]) + z.compress(body[half:]), "zstd"
    if coding == "garbage":
        return draw(st.binary(min_size=1, max_size=32)), draw(st.sampled_from(["gzip", "zstd"]))
    return body, coding


_EXTRA_HEADERS = st.lists(st.tuples(
    st.sampled_from(["anthropic-version", "x-lore-session-id", "session-id", "x-request-id",
                     "anthropic-beta", "chatgpt-account-id", "openai-beta",
                     "x-stainless-lang", "originator", "conversation_id"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=24),
), max_size=3, unique_by=lambda pair: pair[0])

_PATH_SEGMENTS = st.sampled_from(["models", "files", "..", ".", "%2e%2e", "%2F", "a%3Fb",
                                  "%00", "x", "batches", "%252e"])


@st.composite
def client_cases(draw: st.DrawFn) -> ClientCase:
    """A request on any route: model routes mostly, then pass-through and probes."""
    target = draw(st.sampled_from([*ROUTES, *ROUTES, "passthrough", "health", "metrics"]))
    headers = [("authorization", f"Bearer {KEY}"), ("x-api-key", KEY)]
    if target == "health":
        return ClientCase(draw(st.sampled_from(["GET", "HEAD"])), "/health", tuple(headers), b"")
    if target == "metrics":
        return ClientCase("GET", "/metrics", tuple(headers), b"")
    if target == "passthrough":
        path = "/v1/" + "/".join(draw(st.lists(_PATH_SEGMENTS, min_size=1, max_size=3)))
        method = draw(st.sampled_from(["GET", "POST", "DELETE"]))
        body = draw(st.binary(max_size=32)) if method == "POST" else b""
        return ClientCase(method, path, tuple(headers), body)
    path, api = ROUTES[target]
    body, coding = _encode(draw, draw(_body(api)))
    headers.append(("content-type", "application/json"))
    if api == "anthropic":
        headers.append(("anthropic-version", "2023-06-01"))
    if coding is not None:
        headers.append(("content-encoding", coding))
    # One value per name: a provider refuses repeated headers itself, which
    # would only test the fuzz upstream's parser.
    present = {name for name, _ in headers}
    headers.extend(h for h in draw(_EXTRA_HEADERS) if h[0] not in present)
    return ClientCase("POST", path, tuple(headers), body)


# --- upstream streams -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpstreamCase:
    route: str
    stream: bool
    tools: bool
    plan: Plan


def _answers(api: str) -> list[fs.Answer]:
    if api == "chat":
        return [fs.chat_text("fuzz text answer", MODEL, usage_chunk=True),
                fs.chat_call("recall", '{"query":"fuzz"}', MODEL, usage_chunk=False),
                fs.chat_call("read_file", '{"path":"a"}', MODEL, usage_chunk=False)]
    if api == "anthropic":
        return [fs.anthropic_text("fuzz text answer", MODEL),
                fs.anthropic_call("recall", '{"query":"fuzz"}', MODEL),
                fs.anthropic_call("read_file", '{"path":"a"}', MODEL)]
    return [fs.responses_text("fuzz text answer", MODEL),
            fs.responses_call("recall", '{"query":"fuzz"}', MODEL),
            fs.responses_call("read_file", '{"path":"a"}', MODEL)]


def _garble(frame: bytes, cut: int) -> bytes:
    """The frame with its JSON cut short (keeps the framing)."""
    head, sep, data = frame.partition(b"data: ")
    if not sep:
        return frame[: max(1, cut)]
    data = data.rstrip(b"\n")
    return head + sep + data[: cut % max(1, len(data))] + b"\n\n"


@st.composite
def _mutated_frames(draw: st.DrawFn, frames: list[bytes]) -> list[bytes]:
    ops = draw(st.lists(st.sampled_from(["drop", "dup", "dup-last", "garble", "rename",
                                         "junk", "after-terminal", "swap", "bare-data"]),
                        max_size=3))
    out = list(frames)
    for op in ops:
        if not out:
            break
        i = draw(st.integers(min_value=0, max_value=len(out) - 1))
        if op == "drop":
            del out[i]
        elif op == "dup":
            out.insert(i, out[i])
        elif op == "dup-last":
            out.append(out[-1])
        elif op == "garble":
            out[i] = _garble(out[i], draw(st.integers(min_value=0, max_value=200)))
        elif op == "rename":
            name = draw(st.sampled_from(["response.bogus", "message_stop", "response.completed",
                                         "content_block_delta", "ping", "error", "x"]))
            if out[i].startswith(b"event: "):
                out[i] = b"event: " + name.encode() + out[i][out[i].index(b"\n"):]
        elif op == "junk":
            out.insert(i, draw(st.binary(min_size=1, max_size=24)))
        elif op == "after-terminal":
            out.append(out[min(i, len(out) - 1)])
        elif op == "swap" and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], out[i]
        elif op == "bare-data":
            out.insert(i, b"data: " + _dumps(draw(json_values)) + b"\n\n")
    return out


def _rechunk(draw: st.DrawFn, frames: list[bytes]) -> tuple[bytes, ...]:
    data = b"".join(frames)
    if not data or draw(st.booleans()):
        return tuple(f for f in frames if f)[:MAX_CHUNKS] or (b"",)
    cuts = sorted(set(draw(st.lists(st.integers(min_value=1, max_value=max(1, len(data) - 1)),
                                    max_size=8))))
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(data[start:cut])
        start = cut
    pieces.append(data[start:])
    return tuple(p for p in pieces if p)


@st.composite
def upstream_cases(draw: st.DrawFn) -> UpstreamCase:
    route = draw(st.sampled_from(["responses", "codex", "chat", "anthropic"]))
    api = ROUTES[route][1]
    stream = route == "codex" or draw(st.booleans())
    tools = draw(st.booleans())
    answer = draw(st.sampled_from(_answers(api)))
    status = draw(st.sampled_from([200] * 12 + [400, 429, 500, 503]))
    if status != 200:
        return UpstreamCase(route, stream, tools, Plan(
            (draw(st.binary(max_size=64)) if draw(st.booleans()) else b'{"error":{}}',),
            status=status, content_type="application/json"))
    if stream or route == "codex":
        frames = draw(_mutated_frames(list(answer.frames)))
        chunks = _rechunk(draw, frames)
        content_type = draw(st.sampled_from(["text/event-stream"] * 6 + ["application/json"]))
        return UpstreamCase(route, stream, tools, Plan(
            chunks, content_type=content_type, reset=draw(st.booleans()) and draw(st.booleans())))
    body = answer.body
    choice = draw(st.sampled_from(["ok", "ok", "cut", "junk", "value"]))
    if choice == "cut":
        body = body[: draw(st.integers(min_value=0, max_value=len(body)))]
    elif choice == "junk":
        body = draw(st.binary(max_size=48))
    elif choice == "value":
        body = _dumps(draw(json_values))
    return UpstreamCase(route, stream, tools, Plan((body,), content_type="application/json",
                                                   reset=draw(st.booleans())
                                                   and draw(st.booleans())))


# --- the rig and the oracle -----------------------------------------------------------


class _Unexpected(logging.Handler):
    """Counts log records that mean the gateway met an exception it did not expect."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(("lore", "uvicorn")):
            return  # the fuzz upstream's own server (aiohttp) is not under test
        if record.exc_info or record.name.startswith("uvicorn"):
            self.records.append(f"{record.name}: {record.getMessage()}"
                                f" ({record.exc_info[1]!r})" if record.exc_info else
                                f"{record.name}: {record.getMessage()}")


@dataclass
class Outcome:
    status: int
    body: bytes
    aborted: bool


@dataclass
class Tally:
    cases: int = 0
    aborted: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


class FuzzRig:
    """A gateway (storage and recall on, BM25 only) in front of a ``FuzzUpstream``."""

    def __init__(self, data_dir: Path | None = None) -> None:
        from lore_gateway.config import Settings
        from lore_gateway.server import Gateway

        self._tmp = tempfile.TemporaryDirectory(prefix="lore-fuzz-") if data_dir is None else None
        data = Path(self._tmp.name) if self._tmp is not None else data_dir
        assert data is not None
        self._upstream = BackgroundServer(FuzzUpstream(), name="fuzz-upstream")
        self.upstream = self._upstream.start()
        settings = Settings(host="127.0.0.1", port=0, upstream_openai=self.upstream.url,
                            upstream_chatgpt=self.upstream.url + "/backend-api",
                            upstream_anthropic=self.upstream.url, data_dir=data,
                            embeddings=False, store=True, recall=True,
                            # The background worker's calls would meet whatever broken
                            # answer the fuzzer serves at that moment: not a request's case.
                            worker=False)
        self._gateway = BackgroundServer(Gateway(settings), name="fuzz-gateway")
        self.gateway = self._gateway.start()
        self.unexpected = _Unexpected()
        logging.getLogger().addHandler(self.unexpected)
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self.tally = Tally()

    def close(self) -> None:
        logging.getLogger().removeHandler(self.unexpected)
        if self._conn is not None:
            self._conn.close()
        self._gateway.stop()
        self._upstream.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def send(self, method: str, path: str, headers: tuple[tuple[str, str], ...],
             body: bytes) -> Outcome:
        """One request; a kept-alive connection that turns out closed before any
        answer is retried once on a fresh one, as HTTP clients do."""
        reused = self._conn is not None
        out = self._send_once(method, path, headers, body)
        if out.aborted and out.status == 0 and reused:
            out = self._send_once(method, path, headers, body)
        return out

    def _send_once(self, method: str, path: str, headers: tuple[tuple[str, str], ...],
                   body: bytes) -> Outcome:
        host, port = self.gateway.url.removeprefix("http://").split(":")
        if self._conn is None:
            self._conn = http.client.HTTPConnection(host, int(port), timeout=HTTP_TIMEOUT_S)
        conn = self._conn
        try:
            conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.putheader("content-length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            status = response.status
            try:
                data = response.read() if method != "HEAD" else b""
            except (http.client.HTTPException, OSError) as exc:
                self._reset_conn()
                partial = exc.partial if isinstance(exc, http.client.IncompleteRead) else b""
                return Outcome(status, partial or b"", True)
            if response.will_close:
                self._reset_conn()
            return Outcome(status, data, False)
        except (http.client.HTTPException, OSError):
            self._reset_conn()
            return Outcome(0, b"", True)

    def _reset_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def check_client_case(self, case: ClientCase) -> list[str]:
        before = len(self.unexpected.records)
        out = self.send(case.method, case.path, case.headers, case.body)
        problems = self._common(out, before)
        if out.aborted:
            problems.append("the response was cut although the provider behaved")
        elif out.status >= 500:
            problems.append(f"status {out.status}: {out.body[:200]!r}")
        elif 400 <= out.status < 500 and case.method != "HEAD":
            try:
                error = orjson.loads(out.body)
                assert isinstance(error.get("error"), dict)
            except Exception:
                problems.append(f"a {out.status} without a JSON error body: {out.body[:120]!r}")
        if KEY.encode() in out.body:
            problems.append("the credential was echoed to the client")
        return problems

    def check_upstream_case(self, case: UpstreamCase) -> list[str]:
        path, api = ROUTES[case.route]
        body = orjson.dumps(base_request(api, stream=case.stream, tools=case.tools))
        headers = (("authorization", f"Bearer {KEY}"), ("x-api-key", KEY),
                   ("content-type", "application/json"), ("anthropic-version", "2023-06-01"))
        self.upstream.plan = case.plan
        before = len(self.unexpected.records)
        out = self.send("POST", path, headers, body)
        self.upstream.plan = None
        problems = self._common(out, before)
        if out.status == 500 and case.plan.status != 500:
            problems.append(f"the gateway answered 500: {out.body[:200]!r}")
        if KEY.encode() in out.body:
            problems.append("the credential was echoed to the client")
        return problems

    def _common(self, out: Outcome, before: int) -> list[str]:
        tally = self.tally
        tally.cases += 1
        tally.aborted += out.aborted
        tally.by_status[out.status] = tally.by_status.get(out.status, 0) + 1
        problems = list(self.unexpected.records[before:])
        memory = self.gateway.memory
        degraded = memory.degraded if memory is not None else None
        if degraded is not None:
            problems.append(f"memory degraded: {degraded}")
        return problems
