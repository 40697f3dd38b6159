"""Context management through the real gateway and the metered fake upstream:
what the upstream received, byte for byte (issue 13)."""

from __future__ import annotations

import itertools
import re
import urllib.request
from typing import Any

import orjson
import pytest

from lore_gateway.distill import store as dstore
from lore_gateway.protocols.history_anthropic import MAX_BREAKPOINTS, count_breakpoints
from lore_gateway.testing import (
    ANTHROPIC_KEY,
    OPENAI_KEY,
    BackgroundServer,
    FakeUpstream,
    gateway_settings,
    wait_until,
)
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN

SYSTEM = ("You are a coding agent working in a git repository. Read files before editing "
          "them, run the tests after every change, keep diffs small, explain what you "
          "changed and why, and never commit without being asked. ") * 3
TOOLS = [{"name": "bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "shell", "description": "Run a command.",
                    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
FACT = "Remember this: the staging deploy port is 8417 and the service is called tangerine."
WINDOW = 12_000  # tokens; the gateway's budget is 0.7 of it




def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=orjson.dumps(body), method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def output(i: int) -> str:
    """A tool output of ~1.2 KB that differs per round."""
    return f"$ grep -rn handler_{i} src/\n" + "".join(
        f"src/module_{i}/file_{j}.py:{10 * j + i}: def handler_{i}_{j}(request): ...\n"
        for j in range(18))


class AnthropicAgent:
    """An agent loop: each request resends the history plus one tool round."""

    def __init__(self, gw: Any, session: str) -> None:
        self.gw, self.session = gw, session
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": FACT}]}]
        self.rounds = 0

    def send(self, scenario: str | None = None, *, stream: bool = True) -> tuple[int, bytes]:
        body = {"model": "claude-test", "max_tokens": 256, "stream": stream, "system": SYSTEM,
                "tools": TOOLS, "messages": self.messages}
        headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01",
                   "x-lore-session-id": self.session, "x-lore-project": "/work/ctx-e2e"}
        if scenario:
            headers["x-fake-scenario"] = scenario
        return post(self.gw.url + "/v1/messages", body, headers)

    def first_turn(self) -> None:
        """The task alone (stored as the session's first user message), answered."""
        assert self.send()[0] == 200
        self.messages.append({"role": "assistant", "content": [
            {"type": "text", "text": "Noted. Starting on the task."}]})
        self.messages.append({"role": "user", "content": [
            {"type": "text", "text": "Now find every handler and list them."}]})

    def tool_round(self) -> None:
        i = self.rounds
        self.rounds += 1
        self.messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Looking for handler_{i}."},
            {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "bash",
             "input": {"cmd": f"grep -rn handler_{i} src/"}}]})
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}", "content": output(i)}]})


def agent_requests(fake: FakeUpstream) -> list[Any]:
    return [r for r in fake.model_requests if "x-lore-worker" not in r.headers
            and r.path.startswith(("/v1/messages", "/v1/responses", "/v1/chat"))
            and "count_tokens" not in r.path]


def extends(prev: list[Any], new: list[Any]) -> bool:
    """Whether ``new`` starts with exactly the items of ``prev`` (re-serialized
    from the received bytes with the same encoder: equal items, equal bytes)."""
    return len(new) >= len(prev) and all(
        orjson.dumps(a) == orjson.dumps(b) for a, b in zip(prev, new, strict=False))


def rewrites(gw: Any) -> dict[str, float]:
    with urllib.request.urlopen(gw.url + "/metrics") as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r'^lore_context_rewrites_total\{prefix="\w+",reason="(\w+)"\}'
                         r' ([\d.e+]+)$', text, re.M):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


@pytest.fixture
def metered(fake_upstream: FakeUpstream) -> FakeUpstream:
    fake_upstream.metered = True
    return fake_upstream


def test_a_long_anthropic_session_stays_in_budget_and_extends_between_rewrites(
        make_gateway: Any, metered: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = make_gateway(context_window=WINDOW, worker=True, distill_segment_tokens=400,
                      distill_idle_s=3600, worker_max_attempts=1, worker_retry_base_s=0.05)
    agent = AnthropicAgent(gw, "ctx-e2e-anthropic")
    before = rewrites(gw)  # the registry is the process's: count this test's own
    agent.first_turn()
    for _ in range(70):
        agent.tool_round()
        status, _ = agent.send()
        assert status == 200
        if agent.rounds == 6:
            # The first turns are distilled before the budget is reached.
            wait_until(lambda: gw.memory.read(lambda c: dstore.active(
                c, "personal", "ctx-e2e-anthropic")), "a distillation")
    sent = agent_requests(metered)[1:]
    assert len(sent) == 70
    sizes = [len(r.body) // BYTES_PER_TOKEN for r in sent]
    client_last = len(orjson.dumps(agent.messages)) // BYTES_PER_TOKEN
    assert client_last > WINDOW  # the client's own history is past the window
    assert max(sizes) <= 0.75 * WINDOW, sizes
    breaks = 0
    for prev, new in itertools.pairwise(sent):
        # The client's system prompt and tools: byte-identical, recall appended.
        assert new.json["system"] == SYSTEM
        assert new.json["tools"][:1] == TOOLS
        assert count_breakpoints(new.json, new.json["messages"]) <= MAX_BREAKPOINTS
        if not extends(prev.json["messages"], new.json["messages"]):
            breaks += 1
    counted = {k: v - before.get(k, 0) for k, v in rewrites(gw).items()}
    assert 1 <= breaks <= 6
    assert sum(counted.values()) == breaks
    # The distilled prefix carries the first turn's fact; the tail is raw.
    last = sent[-1].json["messages"]
    assert "8417" in orjson.dumps(last[0]).decode()
    assert last[-1] == agent.messages[-1]
    # Calibrated against the reported usage: the estimate is near bytes / 4.
    state = gw.background.context.current("personal", "ctx-e2e-anthropic")
    assert state.samples > 10 and 0.2 < state.ratio < 0.3
    assert state.layer >= 1 and state.cache_read_share > 0.5
    # `lore status` (the gateway's document) and `lore data show` report them.
    gw.memory.flush(10)
    with urllib.request.urlopen(gw.url + "/lore/status") as resp:
        section = orjson.loads(resp.read())["context"]
    assert section["enabled"] and section["sessions_managed"] == 1
    assert section["latest"]["session"] == "ctx-e2e-anthropic"
    assert section["latest"]["layer"] == state.layer
    shown = cli(gw.settings.data_dir, monkeypatch, "data", "show", "ctx-e2e-anthropic")
    assert shown.exit_code == 0, shown.output
    assert f"context: layer {state.layer}, cache-read share" in shown.output


def cli(data_dir: Any, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from typer.testing import CliRunner

    from lore_gateway.cli.main import _register, app

    _register()
    monkeypatch.setenv("LORE_DATA_DIR", str(data_dir))
    monkeypatch.setenv("LORE_EMBEDDINGS", "false")
    return CliRunner().invoke(app, list(args))


def test_recall_and_marker_expansion_work_on_a_rewritten_context(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway(context_window=WINDOW)
    agent = AnthropicAgent(gw, "ctx-e2e-recall")
    agent.first_turn()
    for _ in range(45):
        agent.tool_round()
        assert agent.send()[0] == 200
    assert "lore-gateway: session history" in orjson.dumps(
        agent_requests(metered)[-1].json["messages"][0]).decode()
    gw.memory.flush(10)
    agent.messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    agent.messages.append({"role": "user", "content": [
        {"type": "text", "text": "Which port does staging deploy to?"}]})
    status, raw = agent.send("recall:staging deploy port tangerine", stream=False)
    assert status == 200
    answer = orjson.loads(raw)
    assert "8417" in "".join(b.get("text", "") for b in answer["content"])
    # The follow-up that carried the recall result kept the rewritten layout.
    follow = agent_requests(metered)[-1].json["messages"]
    assert "lore-gateway: session history" in orjson.dumps(follow[0]).decode()
    assert any(b.get("type") == "tool_result" and "8417" in orjson.dumps(b).decode()
               for m in follow[-1:] for b in m["content"])
    # Next turn: the client's marker is expanded back into the exact recall pair,
    # inside the rewritten context, and the request extends the follow-up.
    wait_until(lambda: gw.memory.read(lambda c: c.execute(
        "SELECT count(*) FROM recall_anchors").fetchone()[0]), "the recall anchor")
    agent.messages.append({"role": "assistant", "content": answer["content"]})
    agent.messages.append({"role": "user", "content": [{"type": "text", "text": "Thanks."}]})
    assert agent.send()[0] == 200
    nxt = agent_requests(metered)[-1]
    assert b"lore-recall" not in nxt.body
    assert orjson.dumps(nxt.json["messages"]).startswith(orjson.dumps(follow)[:-1])


def test_a_context_length_error_is_retried_once_at_a_higher_layer(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway()  # the gateway believes the 200K window
    metered.window = 4_000  # the provider has less
    agent = AnthropicAgent(gw, "ctx-e2e-overflow")
    before = rewrites(gw)
    while len(orjson.dumps(agent.messages)) // BYTES_PER_TOKEN < 4_500:
        agent.tool_round()
    status, raw = agent.send()
    assert status == 200, raw
    sent = agent_requests(metered)
    assert len(sent) == 2
    assert len(sent[0].body) // BYTES_PER_TOKEN > 4_000
    assert len(sent[1].body) // BYTES_PER_TOKEN <= 4_000 * 0.75
    assert rewrites(gw).get("overflow", 0) - before.get("overflow", 0) == 1
    # The next request keeps the new layout (no second overflow).
    agent.tool_round()
    assert agent.send()[0] == 200
    assert len(agent_requests(metered)) == 3


def test_with_context_management_off_an_overflow_reaches_the_client(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway(context=False)
    metered.window = 4_000
    agent = AnthropicAgent(gw, "ctx-e2e-overflow-off")
    while len(orjson.dumps(agent.messages)) // BYTES_PER_TOKEN < 4_500:
        agent.tool_round()
    status, _ = agent.send()
    assert status in (400, 413)
    # One request upstream: no retry, and the client's history went as it was.
    sent = agent_requests(metered)
    assert len(sent) == 1
    assert sent[0].json["messages"] == agent.messages


def test_a_non_overflow_error_is_relayed_unchanged(make_gateway: Any,
                                                    metered: FakeUpstream) -> None:
    gw = make_gateway()
    agent = AnthropicAgent(gw, "ctx-e2e-error")
    status, raw = agent.send("status-400")
    assert status == 400 and b"fake upstream error 400" in raw
    assert len(agent_requests(metered)) == 1


def test_a_long_responses_session_keeps_instructions_first(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway(context_window=WINDOW)
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": SYSTEM}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": FACT}]}]
    for i in range(60):
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "shell",
                      "arguments": orjson.dumps({"cmd": f"grep handler_{i}"}).decode()})
        items.append({"type": "function_call_output", "call_id": f"call_{i}",
                      "output": output(i)})
        status, _ = post(gw.url + "/v1/responses", {
            "model": "gpt-test", "stream": True, "store": False, "tools": RESPONSES_TOOLS,
            "input": items}, {"authorization": f"Bearer {OPENAI_KEY}",
                              "session-id": "ctx-e2e-responses"})
        assert status == 200
    sent = agent_requests(metered)
    assert max(len(r.body) // BYTES_PER_TOKEN for r in sent) <= 0.75 * WINDOW
    last = sent[-1].json["input"]
    assert last[0] == items[0]
    assert last[1]["role"] == "user" and "lore-gateway: session history" in orjson.dumps(
        last[1]).decode()
    assert last[-1] == items[-1]
    breaks = sum(1 for a, b in itertools.pairwise(sent)
                 if not extends(a.json["input"], b.json["input"]))
    assert 1 <= breaks <= 6


def test_a_long_chat_session_keeps_the_system_message_first(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway(context_window=WINDOW)
    tools = [{"type": "function", "function": {
        "name": "shell", "parameters": {"type": "object", "properties": {}}}}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": FACT}]
    for i in range(60):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "shell", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output(i)})
        status, _ = post(gw.url + "/v1/chat/completions", {
            "model": "gpt-test", "stream": True, "tools": tools, "messages": messages},
            {"authorization": f"Bearer {OPENAI_KEY}", "x-lore-session-id": "ctx-e2e-chat"})
        assert status == 200
    sent = agent_requests(metered)
    assert max(len(r.body) // BYTES_PER_TOKEN for r in sent) <= 0.75 * WINDOW
    last = sent[-1].json["messages"]
    assert last[0] == messages[0] and last[-1] == messages[-1]
    assert last[1]["role"] == "user" and "session history" in last[1]["content"]
    calls = {c["id"] for m in last for c in m.get("tool_calls") or []}
    assert calls == {m["tool_call_id"] for m in last if m["role"] == "tool"}
    breaks = sum(1 for a, b in itertools.pairwise(sent)
                 if not extends(a.json["messages"], b.json["messages"]))
    assert 1 <= breaks <= 6


def test_another_gateway_on_the_same_database_continues_the_layout(
        make_gateway: Any, metered: FakeUpstream) -> None:
    first = make_gateway(context_window=WINDOW)
    agent = AnthropicAgent(first, "ctx-e2e-shared")
    agent.first_turn()
    for _ in range(40):
        agent.tool_round()
        assert agent.send()[0] == 200
    before = agent_requests(metered)[-1].json["messages"]
    assert "session history" in orjson.dumps(before[0]).decode()
    first.memory.flush(10)
    from lore_gateway.server import Gateway

    runner = BackgroundServer(Gateway(gateway_settings(
        metered, first.settings.data_dir, context_window=WINDOW)), name="second-gateway")
    agent.gw = runner.start()
    try:
        agent.tool_round()
        assert agent.send()[0] == 200
    finally:
        runner.stop()
    after = agent_requests(metered)[-1].json["messages"]
    assert extends(before, after)  # the persisted state renders the same bytes
