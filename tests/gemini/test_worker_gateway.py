"""A Gemini session's turns distilled and curated by the background worker, through
a running gateway, the fake playing both the agent's model and the worker's
(issue 35): the worker asks ``:generateContent`` of the session's model with
the session's own credential, however the session sent it, and the key never
reaches the disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import orjson
import pytest

from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import store as kstore
from lore_gateway.testing import FakeUpstream, wait_until

from .kit import GEMINI_KEY, MODEL

FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600,
        "worker_retry_base_s": 0.05}
DECISION = "Decision: deploy from the tangerine branch. Main stays frozen until the 4.2 release."
BEARER = "ya29.SECRET-oauth-token-0123456789"
TOOLS = [{"functionDeclarations": [{
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]}]
# How the session authenticates: (extra query, headers), and what a worker
# request must carry to match it.
CREDENTIALS = {
    "header-key": ("", {"x-goog-api-key": GEMINI_KEY}),
    "query-key": (f"&key={GEMINI_KEY}", {}),
    "oauth": ("", {"authorization": f"Bearer {BEARER}"}),
}


def say(base: str, text: str, credential: str, project: Path) -> None:
    query, auth = CREDENTIALS[credential]
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], "tools": TOOLS,
            "systemInstruction": {"parts": [{"text": "You are a coding agent."}]}}
    with httpx.Client(timeout=60) as client:
        resp = client.post(f"{base}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse{query}",
                           content=orjson.dumps(body),
                           headers={"content-type": "application/json", **auth,
                                    "x-lore-session-id": f"gemini-worker-{credential}",
                                    "x-lore-project": str(project)})
    assert resp.status_code == 200, resp.text


def workers(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.model_requests if "x-lore-worker" in r.headers]


@pytest.mark.parametrize("credential", list(CREDENTIALS))
def test_a_gemini_session_is_distilled_and_curated_by_a_gemini_request(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path, credential: str) -> None:
    gw = make_gateway(**FAST)
    say(gw.url, DECISION, credential, tmp_path)
    entries = wait_until(lambda: gw.memory.read(lambda c: kstore.entries(c, None, None)),
                         "the curator's entry")
    assert [e.title for e in entries] == ["deploy from the tangerine branch"]
    # Archived: the fake's one-line answer leaves a log no smaller than its turn.
    logs = gw.memory.read(lambda c: dstore.for_scope(c, None, include_archived=True))
    assert logs and logs[0].method == "worker" and "tangerine branch" in logs[0].text

    query, auth = CREDENTIALS[credential]
    sent = workers(fake_upstream)
    assert {r.headers["x-lore-worker"] for r in sent} == {"distill", "curate"}
    for request in sent:
        # The session's model (LORE_WORKER_MODEL_GEMINI=session), not streamed,
        # the key where the session put it.
        assert request.path == f"/v1beta/models/{MODEL}:generateContent" + query.replace(
            "&", "?")
        assert all(request.headers.get(name) == value for name, value in auth.items())
        assert "model" not in request.json and request.json["systemInstruction"]["parts"]
        assert request.json["contents"][0]["role"] == "user"
    files = [p.read_bytes() for p in gw.settings.data_dir.rglob("*") if p.is_file()]
    assert all(GEMINI_KEY.encode() not in data and BEARER.encode() not in data
               for data in files)


def test_a_configured_worker_model_is_asked_and_a_refusal_falls_back_to_the_sessions(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    fake_upstream.unknown_models = {"gemini-cheaper"}
    gw = make_gateway(worker_model_gemini="gemini-cheaper", **FAST)
    say(gw.url, DECISION, "header-key", tmp_path)
    wait_until(lambda: gw.memory.read(lambda c: dstore.for_scope(c, None, include_archived=True)),
               "a distillation")
    paths = [r.path for r in workers(fake_upstream)]
    assert paths[:2] == ["/v1beta/models/gemini-cheaper:generateContent",
                         f"/v1beta/models/{MODEL}:generateContent"]
