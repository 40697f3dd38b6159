"""Google Gemini ``generateContent``: requests, synthesis and turns (sans-IO).

A request is ``contents`` (``{"role": "user" | "model", "parts": [...]}``; a
part holds ``text``, a ``functionCall`` the model made or the
``functionResponse`` that answers it), ``systemInstruction`` (a content whose
parts are the instructions), ``tools`` (``functionDeclarations``) and
``generationConfig``. The model is named in the path, not the body
(``routing.Route.model``). The REST API also reads the proto's snake_case
names (``system_instruction``, ``function_call``); the readers here accept both.

The stream's accumulator is ``gemini_stream.GeminiAccumulator``; this module
frames records as the API does (``stream_from_response``: SSE, as
``alt=sse``; ``array_stream``: the JSON array otherwise) and reads a turn's
messages out of requests and results.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from lore_gateway.protocols.common import Message
from lore_gateway.protocols.gemini_stream import GeminiAccumulator, GeminiResult

RECALL_TOOL_NAME = "recall"
USER_ROLE = "user"
MODEL_ROLE = "model"
# The API's blank line is CRLF: ``data: {...}\r\n\r\n``.
SSE_END = b"\r\n\r\n"
# Between two elements of an array stream, as the API writes it.
ARRAY_SEPARATOR = b"\r\n,\r\n"


def field(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    """A field under its JSON (camelCase) name or its proto (snake_case) one."""
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def system_key(payload: Mapping[str, Any]) -> str:
    """The key the request's system instruction is under (camelCase by default)."""
    return "system_instruction" if "system_instruction" in payload else "systemInstruction"


def parts_of(content: Any) -> list[dict[str, Any]]:
    """The part objects of a content (anything else in ``parts`` skipped)."""
    if not isinstance(content, dict):
        return []
    parts = content.get("parts")
    if isinstance(parts, dict):  # a single part, which the API also reads
        return [parts]
    if not isinstance(parts, list):
        return []
    return [p for p in parts if isinstance(p, dict)]


def parts_text(parts: Iterable[dict[str, Any]], *, thoughts: bool = False) -> str:
    """The text parts joined by newlines (thought summaries only with ``thoughts``)."""
    return "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str)
                     and (thoughts or p.get("thought") is not True))


def function_call(part: Mapping[str, Any]) -> dict[str, Any] | None:
    found = field(part, "functionCall", "function_call")
    return found if isinstance(found, dict) else None


def function_response(part: Mapping[str, Any]) -> dict[str, Any] | None:
    found = field(part, "functionResponse", "function_response")
    return found if isinstance(found, dict) else None


def role_of(content: Mapping[str, Any]) -> str:
    """A content's role; the API reads a missing one as ``user``."""
    role = content.get("role")
    return role if isinstance(role, str) and role else USER_ROLE


def response_text(response: Any) -> str:
    """A function response's output as text: its ``output`` (or ``content``,
    ``result``) string where the client put one there, else its JSON."""
    if isinstance(response, dict):
        for key in ("output", "content", "result"):
            if isinstance(response.get(key), str):
                return str(response[key])
    return json.dumps(response, ensure_ascii=False)


# --- framing ----------------------------------------------------------------------


def sse_frame(record: Any) -> bytes:
    """One record as ``alt=sse`` sends it."""
    return b"data: " + orjson.dumps(record) + SSE_END


def stream_from_response(body: dict[str, Any] | list[Any]) -> list[bytes]:
    """The SSE frames of an answer: one record (a ``GenerateContentResponse``),
    or the records of an array stream (a streamed answer read as JSON)."""
    records = body if isinstance(body, list) else [body]
    return [sse_frame(record) for record in records]


def array_stream(records: Iterable[Any]) -> list[bytes]:
    """The pieces of an array stream: ``[`` with the first record, each next one
    after a separator, and the closing ``]`` alone, as the API flushes them."""
    pieces: list[bytes] = []
    for record in records:
        pieces.append((b"[" if not pieces else ARRAY_SEPARATOR) + orjson.dumps(record))
    pieces.append(b"]" if pieces else b"[]")
    return pieces


# --- turns ------------------------------------------------------------------------


def new_input_messages(body: dict[str, Any]) -> list[Message]:
    """The user-side contents after the model's last one: user text, and each
    function response as a tool message. ``systemInstruction`` is instructions,
    not a turn, and is skipped."""
    contents = [c for c in body.get("contents") or [] if isinstance(c, dict)]
    start = 0
    for pos, content in enumerate(contents):
        if role_of(content) == MODEL_ROLE:
            start = pos + 1
    out: list[Message] = []
    for content in contents[start:]:
        parts = parts_of(content)
        text = parts_text(parts)
        if text:
            out.append(Message("user", text))
        for part in parts:
            answer = function_response(part)
            if answer is not None:
                ref = answer.get("name") or answer.get("id") or ""
                out.append(Message("tool", f"[tool:{ref}] {response_text(answer.get('response'))}"))
    return out


def output_messages(acc: GeminiAccumulator | GeminiResult) -> list[Message]:
    """The first candidate's output: thought summaries, text, then function calls."""
    result = acc.result() if isinstance(acc, GeminiAccumulator) else acc
    out: list[Message] = []
    if result.thoughts:
        out.append(Message("assistant", f"[reasoning] {result.thoughts}"))
    if result.text:
        out.append(Message("assistant", result.text))
    out.extend(
        Message("assistant", f"[tool_call:{c.name}] {c.arguments}") for c in result.tool_calls)
    return out
