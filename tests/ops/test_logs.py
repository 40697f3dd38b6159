"""Logs of a whole gateway session carry request ids but never a credential."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from opskit import ANTHROPIC_KEY, OPENAI_KEY, free_port, ops_env

from lore_gateway.cli.run import probe_health
from lore_gateway.testing import FakeUpstream

ACCESS_TOKEN = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJsZWFrY2hlY2sifQ.c2lnbmF0dXJlLWxlYWs"
ACCOUNT_ID = "acct-leakcheck-5678"
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, ACCESS_TOKEN, ACCOUNT_ID)


async def drive(url: str) -> None:
    """Requests that carry every kind of credential, on success and error paths."""
    openai = {"authorization": f"Bearer {OPENAI_KEY}"}
    chatgpt = {"authorization": f"Bearer {ACCESS_TOKEN}", "chatgpt-account-id": ACCOUNT_ID}
    anthropic = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    responses = {"model": "gpt-fake", "input": "hi", "stream": True}
    calls = [
        ("/v1/responses", openai, responses),
        ("/backend-api/codex/responses", chatgpt, responses),
        ("/v1/chat/completions", openai,
         {"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ("/v1/messages", anthropic,
         {"model": "claude-fake", "max_tokens": 64, "stream": True,
          "messages": [{"role": "user", "content": "hi"}]}),
    ]
    async with aiohttp.ClientSession() as http:
        for scenario in ("text", "status-401", "reset-mid-stream", "malformed-event"):
            for path, headers, body in calls:
                try:
                    async with http.post(url + path, json=body,
                                         headers=headers | {"x-fake-scenario": scenario}) as r:
                        await r.read()
                except aiohttp.ClientError:
                    pass  # a reset mid-stream reaches the client as a broken stream
        async with http.get(url + "/nope", headers=chatgpt | anthropic) as r:
            await r.read()
        async with http.post(url + "/v1/responses", data=b"{not json", headers=openai) as r:
            await r.read()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_credential_in_any_log_output(
    fake_upstream: FakeUpstream, tmp_path: Path, log_format: str
):
    port = free_port()
    env = ops_env(tmp_path, fake_upstream, port) | {
        "LORE_LOG_LEVEL": "debug", "LORE_LOG_FORMAT": log_format,
    }
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway", "serve"], env=env,
            stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while probe_health(url, timeout=0.2) is None:
                assert gateway.poll() is None, stderr_path.read_text()
                assert time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.05)
            asyncio.run(drive(url))
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)

    log_file = Path(env["LORE_DATA_DIR"]) / "logs" / "gateway.log"
    output = stderr_path.read_text() + log_file.read_text()

    # The grep below means something only if requests were logged, tagged.
    assert "POST /v1/responses 200" in output
    request_lines = [line for line in log_file.read_text().splitlines() if "POST /v1/" in line]
    assert request_lines and all("request_id" in line for line in request_lines)
    if log_format == "json":
        for line in log_file.read_text().splitlines():
            json.loads(line)
    for secret in SECRETS:
        assert secret not in output
        assert secret[-16:] not in output  # nor a recognisable piece of it
