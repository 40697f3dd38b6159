"""``lore status`` against a running gateway and with none, and the startup banner."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from clikit import lore, lore_env
from openai import OpenAI

from lore_gateway.testing import FakeUpstream

# The writer commits a turn within milliseconds; this only bounds a broken run.
STORED_DEADLINE_S = 20


def status(env: dict[str, str]) -> dict[str, Any]:
    result = lore(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_status_of_a_running_gateway(
    lore_serve: tuple[str, subprocess.Popen[str], list[str], Path], fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    url, process, banner, data_dir = lore_serve
    assert process.stderr is not None
    while not banner[-1].startswith("  SDKs"):  # the rest of the banner, one write
        banner.append(process.stderr.readline())
    client = OpenAI(base_url=url + "/v1", api_key="sk-status-test-0123456789")
    client.responses.create(model="gpt-fake", input="remember the status test")
    env = lore_env(tmp_path, LORE_PORT=str(urlsplit(url).port), LORE_DATA_DIR=str(data_dir))

    deadline = time.monotonic() + STORED_DEADLINE_S
    document = status(env)
    while document["database"]["turns"] < 1 and time.monotonic() < deadline:
        document = status(env)

    gateway = document["gateway"]
    assert gateway["running"] is True and gateway["version"] == "0.1.0"
    assert gateway["listen"] == url and gateway["uptime_s"] >= 0 and gateway["pid"] > 0
    assert document["upstreams"] == {"openai": fake_upstream.url,
                                     "chatgpt": fake_upstream.url + "/backend-api",
                                     "anthropic": fake_upstream.url,
                                     "gemini": fake_upstream.url}
    assert document["data_dir"] == str(data_dir)
    database = document["database"]
    assert database["path"] == str(data_dir / "lore.db") and database["bytes"] > 0
    assert (database["sessions"], database["turns"]) == (1, 1)
    assert database["messages"] >= 2 and database["embedding_backlog"] >= 0
    assert document["storage"] == {"enabled": True, "queue_depth": 0, "dropped_turns": 0}
    assert document["recall"] == {"enabled": True, "active": True}
    assert document["embeddings"] == {"enabled": False}
    worker = document["worker"]
    assert worker["state"] == "on" and worker["daily_tokens_per_tenant"] > 0
    assert set(worker["jobs"]) >= {"queued", "failed"}
    assert document["tenancy"] in ("personal", "keys")
    compaction = document["compaction"]
    assert compaction["usage_scaling"] is True and compaction["from_memory"] is True
    assert compaction["client_caps"] == {"claude-code": 150_300, "codex": 220_320}
    assert compaction["answered"] == {}  # no agent asked for a compaction
    from lore_gateway.cli.status import fields
    assert ("compaction", "usage capped (Claude Code 150,300, Codex 220,320); 0 answered "
            "from memory, 0 passed through") in fields(document)

    # The banner carried the same essentials.
    text = "".join(banner)
    for fact in (url, fake_upstream.url + "/backend-api", str(data_dir), "storage on",
                 "recall on"):
        assert fact in text, text


def test_status_with_no_gateway_reads_the_disk(tmp_path: Path) -> None:
    env = lore_env(tmp_path, LORE_PORT="1")  # nothing listens on port 1
    document = status(env)
    assert document["gateway"]["running"] is False
    assert document["gateway"]["listen"] == "http://127.0.0.1:1"
    assert document["database"]["exists"] is False

    plain = lore(env, "status")
    assert plain.returncode == 0
    lines = dict(line.split("\t", 1) for line in plain.stdout.splitlines())
    assert lines["gateway"].startswith("down")
    assert lines["recall"] == "on" and lines["tenancy"] == "personal"


def test_status_route_answers_loopback_only(gateway: Any) -> None:
    with urllib.request.urlopen(gateway.url + "/lore/status", timeout=10) as response:
        document = json.loads(response.read())
    assert document["gateway"]["running"] is True
    assert document["gateway"]["listen"] == gateway.url
