"""Credentials go to the upstream and nowhere else: not to logs, not to storage.

The gateway runs as ``lore serve`` in a subprocess at debug log level, so the
test sees exactly what a user's terminal and data directory would hold. It is
driven through every protocol, including error and broken-stream paths (which
are the ones most likely to log a request), then stopped; its output and every
file it wrote are searched for the secrets.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import httpx2 as httpx

from lore_gateway.testing import FakeUpstream

SECRETS = {
    "openai": "sk-proj-SECRET-openai-4f9a2c",
    "anthropic": "sk-ant-SECRET-anthropic-77b1",
    "chatgpt_token": "eyJSECRET.chatgpt.access-token-91c3",
    "account": "acct-SECRET-account-5d2e",
    # A team-mode gateway key: for the gateway only, never forwarded either.
    "gateway_key": "lore_k_SECRET-gateway-key-3c1f",
    # Gemini: an API key (header or ?key=, the real shape) and an OAuth token.
    "gemini": "AIzaSECRETgemini0123456789abcdefghijklm",
    "gemini_oauth": "ya29.SECRET-gemini-oauth-6a0e",
}
# Stored text proves the turns really reached storage (the search is not vacuous).
PROMPT = "remember the striped zebra 8812"


def _drive(url: str) -> None:
    openai_auth = {"authorization": f"Bearer {SECRETS['openai']}",
                   "x-lore-key": SECRETS["gateway_key"]}
    chatgpt_auth = {"authorization": f"Bearer {SECRETS['chatgpt_token']}",
                    "chatgpt-account-id": SECRETS["account"]}
    anthropic_auth = {"x-api-key": SECRETS["anthropic"], "anthropic-version": "2023-06-01"}
    responses = {"model": "gpt-fake", "input": PROMPT, "stream": True}
    chat = {"model": "gpt-fake", "messages": [{"role": "user", "content": PROMPT}]}
    messages = {"model": "claude-fake", "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": PROMPT}]}
    gemini_auth = {"x-goog-api-key": SECRETS["gemini"]}
    gemini_oauth = {"authorization": f"Bearer {SECRETS['gemini_oauth']}"}
    gemini_path = "/v1beta/models/gemini-2.5-flash"
    contents = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
    calls = [
        ("/v1/responses", responses, openai_auth, "text"),
        ("/v1/responses", responses, openai_auth, "status-401"),
        ("/v1/responses", responses, openai_auth, "reset-mid-stream"),
        ("/backend-api/codex/responses", responses, chatgpt_auth, "text"),
        ("/backend-api/codex/responses", {**responses, "stream": False}, chatgpt_auth, "text"),
        ("/backend-api/codex/responses", responses, chatgpt_auth, "status-429"),
        ("/v1/chat/completions", chat, openai_auth, "text"),
        ("/v1/messages?beta=true", messages, anthropic_auth, "text"),
        ("/v1/messages", messages, anthropic_auth, "malformed-event"),
        ("/v1/messages", messages, anthropic_auth, "status-500"),
        (f"{gemini_path}:streamGenerateContent?alt=sse", contents, gemini_auth, "text"),
        (f"{gemini_path}:generateContent?key={SECRETS['gemini']}", contents, {}, "text"),
        (f"{gemini_path}:streamGenerateContent?key={SECRETS['gemini']}", contents, {},
         "reset-mid-stream"),
        (f"{gemini_path}:generateContent", contents, gemini_oauth, "status-500"),
        (f"{gemini_path}:countTokens?key={SECRETS['gemini']}", contents, {}, "text"),
    ]
    with httpx.Client(timeout=30) as client:
        for path, body, auth, scenario in calls:
            # The reset scenario breaks the stream on purpose.
            with contextlib.suppress(httpx.HTTPError):
                client.post(url + path, json=body, headers={**auth, "x-fake-scenario": scenario})
        client.post(url + "/v1/responses", content=b"{not json", headers=openai_auth)
        client.get(url + "/v1/models", headers=openai_auth)
        client.get(url + f"/v1beta/models?key={SECRETS['gemini']}")
        client.post(url + f"{gemini_path}:generateContent?key={SECRETS['gemini']}",
                    content=b"{not json")
        client.get(url + "/v1/responses", headers={**openai_auth, "Upgrade": "websocket",
                                                   "Connection": "Upgrade"})


def test_credentials_reach_upstream_but_never_logs_or_storage(
    lore_serve: tuple[str, subprocess.Popen[str], list[str], Path], fake_upstream: FakeUpstream,
) -> None:
    url, process, seen, data_dir = lore_serve
    _drive(url)
    time.sleep(0.5)  # let the storage writer commit the last turns
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    output = "".join(seen) + stdout + stderr

    sent = {r.headers.get("authorization") for r in fake_upstream.requests}
    assert all(SECRETS["gateway_key"] not in str(r.headers) for r in fake_upstream.requests)
    assert f"Bearer {SECRETS['openai']}" in sent  # credentials did go upstream
    assert f"Bearer {SECRETS['chatgpt_token']}" in sent
    assert f"Bearer {SECRETS['gemini_oauth']}" in sent
    assert any(r.headers.get("x-goog-api-key") == SECRETS["gemini"]
               or f"key={SECRETS['gemini']}" in r.path for r in fake_upstream.requests)
    assert any(r.headers.get("chatgpt-account-id") == SECRETS["account"]
               for r in fake_upstream.requests)

    files = {p: p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}
    assert any(PROMPT.encode() in data for data in files.values()), "no turn was stored"
    assert output.strip(), "the gateway logged nothing at debug level"
    for name, secret in SECRETS.items():
        assert secret not in output, f"{name} credential in the gateway's output"
        for path, data in files.items():
            assert secret.encode() not in data, f"{name} credential in {path}"
