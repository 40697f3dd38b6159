"""aider's turns are coding turns (issue 33, item 6): distilled, curated, and
given knowledge, through a running gateway with the worker on; its helper calls
(commit messages) stay side channels.

aider sends no tools and no session id, and opens every request with a fixed
example exchange (``testing/client_shapes.AiderChat``, built as aider 0.86
builds it). It sends no working directory either, so knowledge, which belongs to
a project, needs ``x-lore-project`` (aider: ``extra_headers`` in its model
settings); distillation does not.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import store as kstore
from lore_gateway.knowledge.block import BLOCK_HEADING
from lore_gateway.testing import OPENAI_KEY, FakeUpstream, wait_until
from lore_gateway.testing import client_shapes as shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kit import ANSWER_HEADER, agent_requests, git_project, read, worker_requests

DECISION = "Decision: deploy from the tangerine branch. Main stays frozen until the 4.2 release."
FAST = {"worker": True, "distill_segment_tokens": 1, "distill_idle_s": 3600,
        "worker_retry_base_s": 0.05}


def aider(gw: Any, body: dict[str, Any], project: Path | None = None) -> bytes:
    headers = {"content-type": "application/json", "authorization": f"Bearer {OPENAI_KEY}",
               **ANSWER_HEADER}
    if project is not None:
        headers["x-lore-project"] = str(project)
    request = urllib.request.Request(gw.url + "/v1/chat/completions", method="POST",
                                     data=orjson.dumps(body), headers=headers)
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def distillations(gw: Any) -> list[dstore.Distillation]:
    return list(read(gw, lambda c: dstore.for_scope(c, None)))


def test_aider_turns_are_distilled_and_its_commit_message_call_is_not(
        make_gateway: Any, fake_upstream: FakeUpstream) -> None:
    gw = make_gateway(**FAST)
    chat = shapes.AiderChat(reminder="user")
    aider(gw, chat.request(DECISION))
    logs = wait_until(lambda: distillations(gw), "the aider session's distillation")
    assert logs[0].method == "worker" and "tangerine branch" in logs[0].text
    (session,) = {s.session for s in gw.memory.sessions(None)}
    assert logs[0].session == session and session.startswith("fp-")
    distill = worker_requests(fake_upstream, "distill")
    assert distill and distill[0].route == "/v1/chat/completions"
    # aider's fixed preamble is not part of what was distilled.
    assert "get_factorial" not in logs[0].text

    fake_upstream.reset()
    aider(gw, shapes.aider_commit_request("--- a/deploy.sh\n+++ b/deploy.sh\n+BRANCH=tangerine"))
    wait_until(lambda: len(gw.memory.sessions(None)) == 2, "the commit call's turn")
    gw.memory.flush(timeout=10)
    assert worker_requests(fake_upstream) == []
    metas = read(gw, lambda c: c.execute(
        "SELECT meta FROM messages WHERE session != ?", (session,)).fetchall())
    assert metas and all("side_channel" in (m[0] or "") for m in metas)


def test_aider_with_a_project_gets_knowledge_in_its_next_conversation(
        make_gateway: Any, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    gw = make_gateway(**FAST)
    aider(gw, shapes.AiderChat().request(DECISION), project)
    wait_until(lambda: list(read(gw, lambda c: kstore.entries(c, None, None))),
               "the curator's entry")
    fake_upstream.reset()
    aider(gw, shapes.AiderChat().request("Which branch do we deploy from?"), project)
    (opening,) = agent_requests(fake_upstream)
    blocks = [m["content"] for m in opening.json["messages"] if m["role"] == "system"
              and BLOCK_HEADING in m["content"]]
    assert blocks and "tangerine branch" in blocks[0]
