"""Worker requests and answers per protocol family (sans-IO).

The worker speaks the session's own protocol to the session's own upstream:
Anthropic Messages, OpenAI Responses, the ChatGPT Codex backend (which only
streams and takes no ``max_output_tokens``), Chat Completions or Gemini
``generateContent`` (whose model and method are in the URL, not the body).
``url`` is where the request goes, ``build`` returns the JSON body; ``parse``
reads the text and token usage from the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

import orjson

from lore_gateway.protocols import gemini
from lore_gateway.protocols.common import ProtocolError
from lore_gateway.protocols.gemini_stream import usage_from_gemini
from lore_gateway.sse import SSEDecoder

Family = Literal["anthropic", "responses", "codex", "chat", "gemini"]

# OpenAI reasoning models spend output tokens on reasoning before the answer; a
# log budget of 256 tokens alone would end many answers before they start (Lore
# #1413). Their limit gets this allowance on top, and low effort.
REASONING_ALLOWANCE_TOKENS = 4_096
_REASONING_PREFIXES = ("gpt-5", "o1", "o3", "o4")


class WorkerAnswerError(ValueError):
    """The upstream's answer to a worker request could not be read."""


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    tokens_in: int | None
    tokens_out: int | None


def url(family: Family, session_url: str, model: str) -> str:
    """Where the worker's request goes: the session's own URL, or for Gemini that
    URL with the worker's model and the non-streamed method in its path
    (``models/{model}:generateContent``), its query kept but ``alt`` (a ``key=``
    credential stays where the session put it)."""
    if family != "gemini":
        return session_url
    parts = urlsplit(session_url)
    base, found, _method = parts.path.rpartition("/models/")
    if not found:
        raise ValueError(f"not a Gemini model URL: {parts.path}")
    path = f"{base}/models/{quote(model, safe='')}:generateContent"
    query = "&".join(q for q in parts.query.split("&") if q and not q.startswith("alt="))
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def build(family: Family, model: str, system: str, user: str,
          max_tokens: int) -> dict[str, Any]:
    if family == "gemini":
        # Gemini 2.5 and later think first, and their thinking counts against
        # ``maxOutputTokens``: the allowance the OpenAI reasoning models get.
        return {"systemInstruction": {"parts": [{"text": system}]},
                "contents": [{"role": gemini.USER_ROLE, "parts": [{"text": user}]}],
                "generationConfig": {"temperature": 0, "maxOutputTokens":
                                     max_tokens + REASONING_ALLOWANCE_TOKENS}}
    if family == "anthropic":
        return {"model": model, "max_tokens": max_tokens, "temperature": 0, "system": system,
                "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]}
    reasoning = model.startswith(_REASONING_PREFIXES)
    limit = max_tokens + (REASONING_ALLOWANCE_TOKENS if reasoning else 0)
    if family == "chat":
        chat: dict[str, Any] = {"model": model, "max_completion_tokens": limit,
                                "messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": user}]}
        if reasoning:
            chat["reasoning_effort"] = "low"
        return chat
    body: dict[str, Any] = {
        "model": model, "instructions": system, "store": False,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": user}]}],
    }
    if reasoning:
        body["reasoning"] = {"effort": "low"}
    if family == "codex":
        body["stream"] = True
    else:
        body["stream"] = False
        body["max_output_tokens"] = limit
    return body


def parse(family: Family, body: bytes) -> Answer:
    """The answer's text and usage; raises ``WorkerAnswerError``."""
    try:
        if family == "codex":
            return _from_response(_completed_response(body))
        payload = orjson.loads(body)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise WorkerAnswerError(f"unreadable worker answer: {exc}") from None
    if not isinstance(payload, dict):
        raise WorkerAnswerError("the worker answer is not a JSON object")
    if family == "anthropic":
        text = "".join(str(b.get("text", "")) for b in payload.get("content") or []
                       if isinstance(b, dict) and b.get("type") == "text")
        usage = payload.get("usage") or {}
        return Answer(text, _int(usage.get("input_tokens")), _int(usage.get("output_tokens")))
    if family == "gemini":
        return _from_gemini(payload)
    if family == "chat":
        choices = payload.get("choices") or [{}]
        message = choices[0].get("message") or {} if isinstance(choices[0], dict) else {}
        usage = payload.get("usage") or {}
        return Answer(str(message.get("content") or ""), _int(usage.get("prompt_tokens")),
                      _int(usage.get("completion_tokens")))
    return _from_response(payload)


def _completed_response(body: bytes) -> dict[str, Any]:
    decoder = SSEDecoder()
    events = [*decoder.feed(body), *decoder.close()]
    for event in events:
        if event.name in ("response.completed", "response.done"):
            data = orjson.loads(event.data)
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict):
                return response
    raise WorkerAnswerError("the worker stream ended without response.completed")


def _from_response(response: dict[str, Any]) -> Answer:
    parts: list[str] = []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    parts.append(str(part.get("text", "")))
    usage = response.get("usage") or {}
    return Answer("".join(parts), _int(usage.get("input_tokens")),
                  _int(usage.get("output_tokens")))


def _from_gemini(payload: dict[str, Any]) -> Answer:
    """The first candidate's text (no thought summaries); its usage as charged:
    the whole prompt in, the answer and its thinking out."""
    candidates = payload.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    content = first.get("content") if isinstance(first, dict) else None
    # Text parts are pieces of one answer (a stream's records concatenate them).
    text = "".join(p["text"] for p in gemini.parts_of(content)
                   if isinstance(p.get("text"), str) and p.get("thought") is not True)
    meta = payload.get("usageMetadata")
    if not isinstance(meta, dict):
        return Answer(text, None, None)
    try:
        usage = usage_from_gemini(meta)
    except ProtocolError as exc:
        raise WorkerAnswerError(f"unreadable worker answer: {exc}") from None
    return Answer(text, usage.prompt_tokens, usage.output_tokens)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None
