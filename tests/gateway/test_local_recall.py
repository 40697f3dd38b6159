"""``lore recall`` answered by the running gateway (``POST /lore/recall``), and its guards."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from typer.testing import CliRunner

from lore_gateway.cli.main import _register, app
from lore_gateway.local_recall import LOCAL_RECALL_PATH, is_loopback
from lore_gateway.memory.tenancy import keys
from lore_gateway.obs.metrics import REGISTRY
from lore_gateway.server import Gateway
from lore_gateway.storage import db, schema
from lore_gateway.testing import BackgroundServer, FakeUpstream, gateway_settings

FACT = "The nightly backup runs from the walrus host."
# A tool offered makes a turn the agent's own: a one-shot request without tools is a
# side channel (knowledge/sidechannel.py), and search never returns those.
TOOLS: Any = [{"type": "function", "name": "exec",
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
_register()


def stored(gw: Any) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-local-recall-01234567",
                           max_retries=0)
    assert client.responses.create(model="gpt-x", input=f"Remember: {FACT}",
                                   tools=TOOLS).output_text
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        if gw.memory.count_turns("personal", project="unknown"):
            return
        time.sleep(0.02)
    pytest.fail("the turn was not stored")


def warm(gw: Any, **headers: str) -> None:
    """Wait for the gateway's first search (it starts the search process, which
    on a loaded machine can take longer than the CLI's 10 s timeout). The
    gateways here run one search worker, so this one is the CLI's."""
    body = {"db": str(Path(gw.settings.db_path).resolve()), "query": "warm", "limit": 1}
    before = served(200)
    assert httpx.post(gw.url + LOCAL_RECALL_PATH, json=body, headers=headers,
                      timeout=120).status_code == 200
    counted(before)  # else its late count is taken for the CLI's request


def counted(before: float) -> None:
    """The gateway counts a request after its response went out: wait for it."""
    deadline = time.monotonic() + 10
    while served(200) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served(200) == before + 1  # the gateway answered, not a local search


def served(status: int) -> float:
    value = REGISTRY.get_sample_value(
        "lore_requests_total", {"route": "local_recall", "status": str(status), "protocol": "none"})
    return value or 0.0


def ask(gw: Any, db: Path, **extra: Any) -> httpx.Response:
    body = {"db": str(db.resolve()), "query": "nightly backup host", "limit": 5, **extra}
    return httpx.post(gw.url + LOCAL_RECALL_PATH, json=body, timeout=30)


def test_cli_recall_is_answered_by_the_running_gateway(
        make_gateway: Any, fake_upstream: FakeUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = make_gateway(search_workers=1)
    stored(gw)
    warm(gw)
    for name, value in (("LORE_DATA_DIR", str(gw.settings.data_dir)),
                        ("LORE_HOST", "127.0.0.1"), ("LORE_PORT", str(gw.port))):
        monkeypatch.setenv(name, value)
    before = served(200)
    result = CliRunner().invoke(app, ["recall", "nightly backup host", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output.splitlines()[-1])
    assert answer["hits"][0]["content"] == f"Remember: {FACT}"
    assert answer["tenants"] == ["personal"]
    counted(before)
    text = CliRunner().invoke(app, ["recall", "nightly backup host"]).output
    assert text.startswith("## Recall Results") and FACT in text


def test_another_database_is_refused_so_the_cli_searches_locally(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = make_gateway()
    assert ask(gw, tmp_path / "elsewhere.db").status_code == 409
    assert ask(gw, gw.settings.db_path, query="").status_code == 400
    assert httpx.get(gw.url + LOCAL_RECALL_PATH).status_code == 405


def test_team_mode_route_needs_the_key(make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway(tenancy="keys")
    refused = ask(gw, gw.settings.db_path)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"


def test_team_mode_cli_recall_sends_lore_key(fake_upstream: FakeUpstream, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    settings = gateway_settings(fake_upstream, tmp_path / "data", tenancy="keys",
                                search_workers=1)
    conn = db.connect(settings.db_path)
    schema.migrate(conn)
    _, alice = keys.create(conn, "alice")
    conn.close()
    runner = BackgroundServer(Gateway(settings), name="team-gateway")
    gw = runner.start()
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-x-0123456789",
                               max_retries=0, default_headers={"X-Lore-Key": alice})
        assert client.responses.create(model="gpt-x", input=f"Remember: {FACT}",
                                   tools=TOOLS).output_text
        deadline = time.monotonic() + 10
        while not gw.memory.count_turns("alice", project="unknown"):
            assert time.monotonic() < deadline, "the turn was not stored"
            gw.memory.flush(timeout=10)
            time.sleep(0.02)
        warm(gw, **{"x-lore-key": alice})
        for name, value in (("LORE_DATA_DIR", str(settings.data_dir)), ("LORE_TENANCY", "keys"),
                            ("LORE_HOST", "127.0.0.1"), ("LORE_PORT", str(gw.port)),
                            ("LORE_KEY", alice)):
            monkeypatch.setenv(name, value)
        before = served(200)
        result = CliRunner().invoke(app, ["recall", "nightly backup host", "--json"])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.output.splitlines()[-1])
        assert answer["tenants"] == ["alice"] and FACT in answer["hits"][0]["content"]
        counted(before)
    finally:
        runner.stop()


def test_only_loopback_clients() -> None:
    assert is_loopback(("127.0.0.1", 5000)) and is_loopback(("::1", 5000))
    assert is_loopback(("127.8.0.3", 1))
    assert not is_loopback(("192.168.1.20", 5000)) and not is_loopback(None)
    assert not is_loopback(("unix-socket", 0))
