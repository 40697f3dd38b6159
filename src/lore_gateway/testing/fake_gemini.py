"""The fake provider's Gemini ``generateContent`` API: paths, answers, strict rules.

Pure helpers of ``fake_upstream`` (which records, scripts and delivers): which
path is a Gemini method (:func:`gemini_method`), the answer a scenario makes as
``GenerateContentResponse`` records (:func:`answer`: a streamed answer is
several records, its non-stream body the same answer in one), the API's error
bodies, its model listing and token count, and the rules the real API enforces
(:func:`check`), answered with its own 400:
``{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}``.

The rules (the messages are the API's own, as its clients report them):

- a content's role is ``user`` or ``model`` ("Please use a valid role: user, model.");
- ``contents`` is not empty, nor is any content's ``parts``;
- a function call turn comes right after a user turn or a function response turn;
- a function response turn comes right after a function call turn, with as many
  function response parts as that turn has function call parts;
- the body fits the model's window (bytes / 4 against ``window``).

Scenarios: ``text[:words]``, ``blank``, ``recall[:query]`` (a ``recall``
functionCall; once the contents end with its functionResponse, text quoting the
output), ``call-recall[:query]`` (a recall call even then), ``tool:<name>
<json>``, ``incomplete`` (finishReason ``MAX_TOKENS``), ``minimal`` (one
record), ``failed`` (an error record mid-stream), ``too-long``, ``status-<code>``;
the delivery misbehaviours of ``fake_delivery`` work on the records' frames.
Ids are derived from the request, so the same request gives the same bytes
directly and through the gateway.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from lore_gateway.protocols import gemini
from lore_gateway.testing import fake_streams as fs
from lore_gateway.testing.fake_scenarios import BLANK_TEXT, Scenario
from lore_gateway.testing.fake_wire import recall_answer_text
from lore_gateway.testing.strict import Refusal

# /{version}/models/{model}:{method}, as the API names its methods.
_METHOD = re.compile(r"^/(?:v1beta|v1)/models/([A-Za-z0-9._-]+):([A-Za-z]+)$")
_MODEL_PATH = re.compile(r"^/(?:v1beta|v1)/models(?:/([A-Za-z0-9._-]+))?$")
GENERATE = ("generateContent", "streamGenerateContent")
DEFAULT_MODEL = "gemini-fake"
# A whole answer's prompt figure when the fake does not meter (as the canned
# answers of the other shapes report a small one).
PROMPT_TOKENS = 12
TOO_LONG = ("The input token count (1200293) exceeds the maximum number of tokens "
            "allowed (1048576).")
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def gemini_method(method: str, path: str) -> tuple[str, str] | None:
    """(model, method) of a Gemini model method path, else None."""
    found = _METHOD.match(path) if method == "POST" else None
    return (found.group(1), found.group(2)) if found else None


def model_path(method: str, path: str) -> tuple[bool, str | None]:
    """Whether this GET lists models (or reads one, named)."""
    found = _MODEL_PATH.match(path) if method == "GET" else None
    return (found is not None, found.group(1) if found else None)


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"error": {"code": status, "message": message,
                                   "status": _STATUS_NAMES.get(status, "UNKNOWN")}})


def refusal(rule: str, message: str) -> Refusal:
    return Refusal(400, error_body(400, message), rule, message)


def models_body(name: str | None) -> bytes:
    model = {"name": f"models/{name or DEFAULT_MODEL}", "displayName": "Gemini Fake",
             "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536,
             "supportedGenerationMethods": ["generateContent", "countTokens"]}
    return orjson.dumps(model if name else {"models": [model]})


def count_tokens_body(body: bytes) -> bytes:
    return orjson.dumps({"totalTokens": max(1, len(body) // 4)})


# --- strict rules --------------------------------------------------------------------


def _has(content: dict[str, Any], key: str, snake: str) -> int:
    return sum(1 for p in gemini.parts_of(content) if gemini.field(p, key, snake) is not None)


def check(payload: Any) -> Refusal | None:
    """The API's refusal of this request's contents, or None when it accepts them."""
    if not isinstance(payload, dict):
        return None
    contents = payload.get("contents")
    if not isinstance(contents, list) or not contents:
        return refusal("gemini.contents", "* GenerateContentRequest.contents: contents is "
                                          "not specified\n")
    previous: dict[str, Any] | None = None
    for pos, content in enumerate(contents):
        if not isinstance(content, dict):
            return refusal("gemini.content", f"Invalid value at 'contents[{pos}]'")
        role = content.get("role", gemini.USER_ROLE)
        if role not in (gemini.USER_ROLE, gemini.MODEL_ROLE):
            return refusal("gemini.role", "Please use a valid role: user, model.")
        if not gemini.parts_of(content):
            return refusal("gemini.parts", f"* GenerateContentRequest.contents[{pos}].parts: "
                                           "contents.parts must not be empty.\n")
        calls = _has(content, "functionCall", "function_call")
        answers = _has(content, "functionResponse", "function_response")
        before_calls = _has(previous, "functionCall", "function_call") if previous else 0
        if calls and (previous is None or gemini.role_of(previous) != gemini.USER_ROLE):
            return refusal("gemini.call_position",
                           "Please ensure that function call turn comes immediately after a "
                           "user turn or after a function response turn.")
        if answers and not before_calls:
            return refusal("gemini.response_position",
                           "Please ensure that function response turn comes immediately after "
                           "a function call turn.")
        if before_calls and answers != before_calls:
            return refusal("gemini.response_count",
                           "Please ensure that the number of function response parts is equal "
                           "to the number of function call parts of the function call turn.")
        previous = content
    return None


def check_window(body: bytes, window: int) -> Refusal | None:
    tokens = len(body) // 4
    if tokens <= window:
        return None
    return refusal("window", f"The input token count ({tokens}) exceeds the maximum number "
                             f"of tokens allowed ({window}).")


# --- answers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeminiAnswer:
    """One answer: its stream's records and the same answer as one body."""

    records: tuple[dict[str, Any], ...]
    body: dict[str, Any]


def recall_output(payload: Any) -> str | None:
    """The ``recall`` function response the contents end with, as text."""
    contents = payload.get("contents") if isinstance(payload, dict) else None
    if not isinstance(contents, list) or not contents or not isinstance(contents[-1], dict):
        return None
    for part in reversed(gemini.parts_of(contents[-1])):
        answer = gemini.function_response(part)
        if answer is not None:
            return gemini.response_text(answer.get("response"))
    return None


def answer(scenario: Scenario, payload: dict[str, Any], model: str, text: str,
           deltas: int | None, usage: dict[str, int] | None = None) -> GeminiAnswer:
    """The well-formed answer a scenario is built on (misbehaviours bend it later)."""
    name = scenario.name
    if name == "text" and scenario.arg:
        text = scenario.arg
    if name == "blank":
        text = BLANK_TEXT
    if name == "tool" and scenario.arg:
        tool, _, arguments = scenario.arg.partition(" ")
        return _call(tool, orjson.loads(arguments or "{}"), model, usage)
    if name in ("recall", "call-recall"):
        output = recall_output(payload)
        if output is None or name == "call-recall":
            query = scenario.arg or fs.DEFAULT_RECALL_QUERY
            return _call(fs.RECALL_TOOL, {"query": query}, model, usage)
        text = recall_answer_text(output)
    finish = "MAX_TOKENS" if name == "incomplete" else "STOP"
    pieces = [text] if name == "minimal" else fs.split_deltas(text, deltas)
    return _answer([[{"text": piece}] for piece in pieces], finish, model, usage)


def error_record(message: str) -> dict[str, Any]:
    """An error record, as the API ends a stream that failed."""
    return {"error": {"code": 500, "message": message, "status": "INTERNAL"}}


def _call(name: str, args: Any, model: str, usage: dict[str, int] | None) -> GeminiAnswer:
    return _answer([[{"functionCall": {"name": name, "args": args}}]], "STOP", model, usage)


def _usage(records: int, usage: dict[str, int] | None) -> dict[str, int]:
    prompt = (usage or {}).get("promptTokenCount", PROMPT_TOKENS)
    out = {"promptTokenCount": prompt, "candidatesTokenCount": records,
           "totalTokenCount": prompt + records}
    if usage and usage.get("cachedContentTokenCount"):
        out["cachedContentTokenCount"] = usage["cachedContentTokenCount"]
    return out


def _answer(chunks: list[list[dict[str, Any]]], finish: str, model: str,
            usage: dict[str, int] | None) -> GeminiAnswer:
    """Records of ``chunks`` (each the parts of one record), the last finishing;
    every record carries the response's id (derived from the content, as the
    other shapes' ids are) and model, the usage grows."""
    rid = hashlib.sha1(orjson.dumps([chunks, finish]) + model.encode()).hexdigest()[:22]
    head = {"modelVersion": model, "responseId": rid}
    records: list[dict[str, Any]] = []
    for pos, parts in enumerate(chunks):
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": gemini.MODEL_ROLE}}
        if pos == len(chunks) - 1:
            candidate["finishReason"] = finish
        candidate["index"] = 0
        records.append({"candidates": [candidate], "usageMetadata": _usage(pos + 1, usage),
                        **head})
    merged: list[dict[str, Any]] = []
    for parts in chunks:
        for part in parts:
            if merged and "text" in part and set(merged[-1]) == {"text"}:
                merged[-1] = {"text": merged[-1]["text"] + part["text"]}
            else:
                merged.append(dict(part))
    body = {"candidates": [{"content": {"parts": merged, "role": gemini.MODEL_ROLE},
                            "finishReason": finish, "index": 0}],
            "usageMetadata": _usage(len(chunks), usage), **head}
    return GeminiAnswer(tuple(records), body)


def frames(records: tuple[dict[str, Any], ...], sse: bool) -> tuple[bytes, ...]:
    """The answer's bytes as the API flushes them: SSE frames, or the array's pieces."""
    if sse:
        return tuple(gemini.sse_frame(record) for record in records)
    return tuple(gemini.array_stream(records))
