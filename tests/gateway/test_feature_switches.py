"""Each feature of the request pipeline switches off on its own setting: with
``LORE_RECALL=false`` the upstream still gets the session's knowledge block and
the context-managed history, and no recall tool (issue 34)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream

SYSTEM = ("You are a coding agent working in a git repository. Read files before editing "
          "them, run the tests after every change, keep diffs small, explain what you "
          "changed and why, and never commit without being asked. ") * 3
TOOLS = [{"name": "bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
WINDOW = 12_000  # tokens: a session of tool rounds outgrows it within a few dozen
SESSION = "recall-off-session"


def send(gw: Any, project: Path, messages: list[dict[str, Any]]) -> None:
    body = {"model": "claude-test", "max_tokens": 256, "stream": True, "system": SYSTEM,
            "tools": TOOLS, "messages": messages}
    request = urllib.request.Request(gw.url + "/v1/messages", data=orjson.dumps(body),
                                     method="POST", headers={
                                         "content-type": "application/json",
                                         "x-api-key": ANTHROPIC_KEY,
                                         "anthropic-version": "2023-06-01",
                                         "x-lore-session-id": SESSION,
                                         "x-lore-project": str(project)})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        resp.read()


def tool_round(messages: list[dict[str, Any]], i: int) -> None:
    messages.append({"role": "assistant", "content": [
        {"type": "tool_use", "id": f"toolu_{i:04d}", "name": "bash",
         "input": {"cmd": f"grep -rn handler_{i} src/"}}]})
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}", "content": "".join(
            f"src/module_{i}/file_{j}.py:{j}: def handler_{i}_{j}(request): ...\n"
            for j in range(18))}]})


def test_recall_off_keeps_knowledge_and_context_management(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    fake_upstream.metered = True
    gw = make_gateway(recall=False, context_window=WINDOW, worker=True,
                      distill_segment_tokens=400, distill_idle_s=3600,
                      worker_retry_base_s=0.05)
    assert gw.recall is None and gw.proxy.recall is None
    project = tmp_path / "repo"
    project.mkdir()
    gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant=PERSONAL, project=str(project), category="decision", title="Deploy branch",
        content="Deploy from the tangerine branch; main stays frozen."))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Find every handler and list them."}]
    sent: list[Any] = []
    for i in range(70):
        send(gw, project, messages)
        sent = [r for r in fake_upstream.model_requests if "x-lore-worker" not in r.headers
                and r.path.startswith("/v1/messages")]
        if len(sent[-1].json["messages"]) < len(messages):
            break
        tool_round(messages, i)
    else:
        pytest.fail("the history was never rewritten")
    last = sent[-1].json
    # Context management rewrote the history: fewer items than the client sent,
    # its newest item as the client sent it.
    assert len(last["messages"]) < len(messages)
    assert last["messages"][-1] == messages[-1]
    state = gw.background.context.current(PERSONAL, SESSION)
    assert state is not None and state.layer >= 1
    # The knowledge block went upstream with every request.
    assert all(BLOCK_HEADING in json.dumps(r.json["system"]) for r in sent)
    assert "tangerine branch" in json.dumps(last["system"])
    # And never the recall tool.
    assert all([t["name"] for t in r.json["tools"]] == ["bash"] for r in sent)
