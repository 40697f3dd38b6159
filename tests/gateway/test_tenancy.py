"""Whose memory a request is, through the running gateway (docs/memory.md, "Tenancy").

Personal mode (the default): two provider credentials, one memory; the recall
tool of one finds what the other said. Team mode: the gateway key decides, a
request without a valid key gets a 401 in the error shape SDKs understand and
reaches neither the upstream nor storage, and the key never goes upstream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from lore_gateway.config import Settings
from lore_gateway.local_recall import LOCAL_RECALL_PATH, database_name
from lore_gateway.memory.store.records import Identity
from lore_gateway.memory.tenancy import keys
from lore_gateway.storage import db, schema
from lore_gateway.testing import BackgroundServer, FakeUpstream, gateway_settings

# Isolation is every query's job, so it is checked on both storage backends.
pytestmark = pytest.mark.both_backends

KEY_A = "sk-tenancy-openai-0123456789"
KEY_B = "sk-ant-tenancy-anthropic-0123456789"
FACT = "The release train leaves on the marmoset schedule."
# The gateway offers recall only to requests that already offer tools (lore-spec B.8).
ANTHROPIC_TOOL = {"name": "read_file", "description": "Read a file.",
                  "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
RESPONSES_TOOL = {"type": "function", "name": "read_file", "description": "Read a file.",
                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


def wait_stored(gw: Any, text: str, tenant: str | None = None) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        gw.memory.flush(timeout=10)
        if any(text in m.content for s in gw.memory.sessions(tenant)
               for m in gw.memory.session_messages(tenant, s.session)):
            return
        time.sleep(0.02)
    pytest.fail(f"{text!r} was not stored")


def test_personal_mode_two_credentials_share_one_memory(make_gateway: Any,
                                                        fake_upstream: FakeUpstream) -> None:
    gw = make_gateway()
    codex_like = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0)
    # A tool offered makes it the agent's own turn: a one-shot request without tools
    # is a side channel (knowledge/sidechannel.py), and search never returns those.
    assert codex_like.responses.create(model="gpt-x", input=f"Remember: {FACT}",
                                      tools=[RESPONSES_TOOL]).output_text
    wait_stored(gw, FACT)
    claude_like = anthropic.Anthropic(base_url=gw.url, api_key=KEY_B, max_retries=0)
    answer = claude_like.messages.create(
        model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "When?"}],
        tools=[ANTHROPIC_TOOL],
        extra_headers={"x-fake-scenario": "recall:release train schedule"})
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert f"According to memory: - (user, 0m ago) Remember: {FACT}" in text
    assert [t.tenant for t in gw.memory.tenants()] == ["personal"]


@pytest.fixture
def team_gateway(fake_upstream: FakeUpstream, tmp_path: Path,
                 database_url: str | None) -> Iterator[tuple[Any, str, str]]:
    """A team-mode gateway whose database already holds keys for alice and bob."""
    settings: Settings = gateway_settings(fake_upstream, tmp_path, tenancy="keys")
    conn = db.connect(settings.database)
    schema.migrate(conn)
    _, alice = keys.create(conn, "alice")
    _, bob = keys.create(conn, "bob")
    conn.close()
    from lore_gateway.server import Gateway

    runner = BackgroundServer(Gateway(settings), name="team-gateway")
    yield runner.start(), alice, bob
    runner.stop()


def test_team_mode_refuses_requests_without_a_valid_key(team_gateway: tuple[Any, str, str],
                                                        fake_upstream: FakeUpstream) -> None:
    gw, _, _ = team_gateway
    no_key = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        no_key.responses.create(model="gpt-x", input="store me somewhere")
    assert refused.value.status_code == 401
    assert "X-Lore-Key" in str(refused.value) and "lore keys create" in str(refused.value)
    # Retrying cannot help, and clients that honour this report it at once.
    assert refused.value.response.headers["x-should-retry"] == "false"
    wrong = anthropic.Anthropic(base_url=gw.url, api_key=KEY_B, max_retries=0,
                                default_headers={"x-lore-key": "lore_k_not-a-real-key"})
    with pytest.raises(anthropic.AuthenticationError) as refused_too:
        wrong.messages.create(model="claude-x", max_tokens=10,
                              messages=[{"role": "user", "content": "store me too"}])
    assert refused_too.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "unknown or revoked" in str(refused_too.value)
    assert fake_upstream.model_requests == []
    gw.memory.flush(timeout=10)
    assert gw.memory.tenants() == []


def test_team_mode_the_key_selects_the_tenant_and_never_goes_upstream(
        team_gateway: tuple[Any, str, str], fake_upstream: FakeUpstream) -> None:
    gw, alice, bob = team_gateway
    as_alice = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0,
                             default_headers={"X-Lore-Key": alice})
    assert as_alice.responses.create(model="gpt-x", input=f"Remember: {FACT}",
                                     tools=[RESPONSES_TOOL]).output_text  # see above
    wait_stored(gw, FACT, "alice")
    (upstream,) = fake_upstream.model_requests
    assert "x-lore-key" not in {k.lower() for k in upstream.headers}
    assert upstream.headers["authorization"] == f"Bearer {KEY_A}"

    # Bob, with the same provider key as alice, recalls nothing of hers.
    as_bob = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0,
                           default_headers={"X-Lore-Key": bob})
    answer = as_bob.responses.create(
        model="gpt-x", input="When does the release train leave?", tools=[RESPONSES_TOOL],
        extra_headers={"x-fake-scenario": "recall:release train schedule"}).output_text
    assert FACT not in answer
    hits = gw.memory.search_sync("release train", identity=Identity("bob", "x", "y")).hits
    assert not any(FACT in h.content for h in hits)
    # Alice's own recall finds it.
    answer = as_alice.responses.create(
        model="gpt-x", input="When does the release train leave?", tools=[RESPONSES_TOOL],
        extra_headers={"x-fake-scenario": "recall:release train schedule"}).output_text
    assert FACT in answer
    # The same through the route `lore recall` uses.
    ask = {"db": database_name(gw.settings), "query": "release train schedule"}
    for key, found in ((alice, True), (bob, False)):
        reply = httpx.post(gw.url + LOCAL_RECALL_PATH, json=ask, headers={"x-lore-key": key})
        assert reply.status_code == 200
        assert (FACT in json.dumps(reply.json()["hits"])) is found


def test_a_revoked_key_is_refused_by_the_running_gateway(
        team_gateway: tuple[Any, str, str], fake_upstream: FakeUpstream) -> None:
    gw, alice, _ = team_gateway
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0,
                           default_headers={"X-Lore-Key": alice})
    assert client.responses.create(model="gpt-x", input="hello").output_text
    conn = db.connect(gw.settings.database)
    (key,) = [k for k in keys.list_keys(conn) if k.tenant == "alice"]
    keys.revoke(conn, key.id)
    conn.close()
    # The key ring re-reads the table every REFRESH_SECONDS; allow a few rounds.
    deadline = time.monotonic() + 20 * keys.REFRESH_SECONDS
    while time.monotonic() < deadline:
        try:
            client.responses.create(model="gpt-x", input="hello again")
        except openai.AuthenticationError:
            return
        time.sleep(keys.REFRESH_SECONDS / 4)
    pytest.fail("the revoked key was still accepted")
