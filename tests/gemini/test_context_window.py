"""A Gemini session's context is sized by the model its path names (issue 35).

Gemini sends no ``model`` in the body; the window comes from ``Route.model``.
The same long conversation passes untouched under a ``gemini-`` model (a 1M
window) and is rewritten under a model the window table does not know (the
200K default), which is what every Gemini session got while only the body's
``model`` was read.
"""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import orjson

from lore_gateway.testing import FakeUpstream

from .kit import GEMINI_KEY, MODEL

TOOLS = [{"functionDeclarations": [{
    "name": "shell", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]}]
# Rounds of ~12 KB of tool output: ~480 KB of history, over the default window's
# budget by the uncalibrated estimate (0.39 tokens a byte: ~187K of 140K) and far
# under a 1M window's.
ROUNDS = 40


def conversation() -> dict[str, Any]:
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "Find every handler in the repository."}]}]
    for i in range(ROUNDS):
        found = "".join(f"src/module_{i}/file_{j}.py:{j}: def handler_{i}_{j}(request): ...\n"
                        for j in range(180))
        contents += [
            {"role": "model", "parts": [{"functionCall": {"name": "shell",
                                                          "args": {"cmd": f"grep {i}"}}}]},
            {"role": "user", "parts": [{"functionResponse": {
                "name": "shell", "response": {"output": found}}}]}]
    return {"contents": contents, "tools": TOOLS,
            "systemInstruction": {"parts": [{"text": "You are a coding agent."}]}}


def send(base: str, model: str, session: str) -> None:
    with httpx.Client(timeout=60) as client:
        resp = client.post(f"{base}/v1beta/models/{model}:generateContent",
                           content=orjson.dumps(conversation()),
                           headers={"content-type": "application/json",
                                    "x-goog-api-key": GEMINI_KEY,
                                    "x-lore-session-id": session})
    assert resp.status_code == 200, resp.text


def test_the_window_is_the_path_models(make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    history = conversation()["contents"]

    send(gw.url, MODEL, "gemini-window-1m")
    assert fake_upstream.model_requests[-1].json["contents"] == history

    send(gw.url, "unlisted-model", "gemini-window-default")
    rewritten = fake_upstream.model_requests[-1]
    assert rewritten.path.startswith("/v1beta/models/unlisted-model:")
    assert len(orjson.dumps(rewritten.json["contents"])) < len(orjson.dumps(history)) // 2
