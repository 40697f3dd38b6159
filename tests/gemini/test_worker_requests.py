"""The background worker's Gemini request and answer (sans-IO), and what of a
Gemini session's credential it holds."""

from __future__ import annotations

import orjson
import pytest

from lore_gateway.worker import requests as wreq
from lore_gateway.worker.credentials import SessionUpstream, kept_headers

from .kit import GEMINI_KEY

BASE = "https://generativelanguage.googleapis.com"


def test_the_request_is_a_generate_content_body_without_a_model() -> None:
    body = wreq.build("gemini", "gemini-2.5-flash", "You distil sessions.", "the segment", 500)
    assert body == {
        "systemInstruction": {"parts": [{"text": "You distil sessions."}]},
        "contents": [{"role": "user", "parts": [{"text": "the segment"}]}],
        "generationConfig": {"temperature": 0,
                             "maxOutputTokens": 500 + wreq.REASONING_ALLOWANCE_TOKENS}}


@pytest.mark.parametrize(("session", "worker"), [
    (f"{BASE}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
     f"{BASE}/v1beta/models/gemini-2.5-flash:generateContent"),
    (f"{BASE}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key={GEMINI_KEY}",
     f"{BASE}/v1beta/models/gemini-2.5-flash:generateContent?key={GEMINI_KEY}"),
    (f"{BASE}/v1/models/gemini-2.5-pro:generateContent?key={GEMINI_KEY}",
     f"{BASE}/v1/models/gemini-2.5-flash:generateContent?key={GEMINI_KEY}"),
    ("http://proxy.internal:8080/google/v1beta/models/gemini-2.5-pro:streamGenerateContent",
     "http://proxy.internal:8080/google/v1beta/models/gemini-2.5-flash:generateContent"),
])
def test_the_url_names_the_worker_model_and_keeps_the_key(session: str, worker: str) -> None:
    assert wreq.url("gemini", session, "gemini-2.5-flash") == worker


def test_other_families_post_to_the_session_url() -> None:
    url = "https://api.openai.com/v1/responses"
    assert all(wreq.url(family, url, "m") == url
               for family in ("anthropic", "responses", "codex", "chat"))
    with pytest.raises(ValueError, match="not a Gemini model URL"):
        wreq.url("gemini", url, "m")


def test_the_answer_is_the_first_candidates_text_and_its_charged_usage() -> None:
    answer = {"candidates": [{"content": {"role": "model", "parts": [
                  {"text": "planning the log", "thought": True},
                  {"text": "<observations>\n"}, {"text": "* 🔴 (10:00) a fact\n</observations>"}]},
                  "finishReason": "STOP", "index": 0}],
              "usageMetadata": {"promptTokenCount": 900, "cachedContentTokenCount": 300,
                                "candidatesTokenCount": 40, "thoughtsTokenCount": 60,
                                "totalTokenCount": 1000},
              "modelVersion": "gemini-2.5-flash"}
    parsed = wreq.parse("gemini", orjson.dumps(answer))
    # Thought summaries are not the answer; the whole prompt is input, the
    # thinking is output (as Gemini bills it).
    assert parsed == wreq.Answer("<observations>\n* 🔴 (10:00) a fact\n</observations>",
                                 900, 100)


def test_an_answer_without_usage_or_candidates_is_read_and_a_broken_one_is_not() -> None:
    assert wreq.parse("gemini", b'{"candidates": []}') == wreq.Answer("", None, None)
    assert wreq.parse("gemini", b'{"promptFeedback": {"blockReason": "SAFETY"}}') == \
        wreq.Answer("", None, None)
    with pytest.raises(wreq.WorkerAnswerError):
        wreq.parse("gemini", b'{"candidates": [], "usageMetadata": {"promptTokenCount": -1}}')
    with pytest.raises(wreq.WorkerAnswerError):
        wreq.parse("gemini", b"[{")


def test_the_sessions_credential_is_kept_and_never_shown() -> None:
    headers = kept_headers([("x-goog-api-key", GEMINI_KEY), ("x-goog-user-project", "proj"),
                            ("authorization", "Bearer ya29.token"), ("x-lore-project", "/p"),
                            ("content-type", "application/json")])
    assert dict(headers) == {"x-goog-api-key": GEMINI_KEY, "x-goog-user-project": "proj",
                             "authorization": "Bearer ya29.token"}
    upstream = SessionUpstream(family="gemini", model="gemini-2.5-pro", project="/p",
                               url=f"{BASE}/v1beta/models/gemini-2.5-pro:generateContent"
                                   f"?key={GEMINI_KEY}", headers=headers)
    assert GEMINI_KEY not in repr(upstream) and "ya29" not in repr(upstream)
