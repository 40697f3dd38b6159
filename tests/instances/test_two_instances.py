"""Two ``lore serve`` processes on one database serve one memory (issue 17).

A client alternates between the instances through one Claude-style coding
session with recalls, as a load balancer would send it: each recall marker
expands exactly on the other instance, a turn stored via one is recalled via
the other, nothing is stored twice, and each background job runs once. Then one
instance is killed mid-stream; the other goes on serving the session and nothing
stored before is lost.
"""

from __future__ import annotations

import http.client
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from lore_gateway.distill.store import DISTILL_PROTOCOL
from lore_gateway.knowledge.block import UPDATE_HEADING
from lore_gateway.storage import db
from lore_gateway.storage.target import parse_url
from lore_gateway.testing import ANTHROPIC_KEY, FakeUpstream, wait_until

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0
# A ceiling, not a delay: polls return as soon as the state is there. Curation is
# background work behind the turn, so a loaded 2-core machine can take long.
WAIT_S = 90.0
SYSTEM = ("You are a coding agent working in a git repository. Read files before editing "
          "them, run the tests after every change, keep diffs small, explain what you "
          "changed and why, and never commit without being asked. ") * 3
TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
ANSWER = ("I read the deployment scripts and the CI configuration, checked which branches "
          "the release job builds from, and compared the staging and production settings. "
          "Nothing else needs to change for now; the next step is to run the test suite. ") * 2
FACT = "Decision: the deploy key lives in the vault called tangerine-seven; rotate it monthly."


class Instance:
    """One ``lore serve`` subprocess; its own data dir (logs), the shared database."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway", "serve", "--port", "0"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.process.stderr is not None
        seen: list[str] = []
        url = None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while url is None and time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            url = match.group(1) if match else None
        if url is None:
            self.process.kill()
            pytest.fail(f"lore serve ({name}) did not start:\n" + "".join(seen))
        self.url = url

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'lore.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def instances(fake_upstream: FakeUpstream, shared_url: str,
              tmp_path: Path) -> Iterator[Callable[[str], Instance]]:
    started: list[Instance] = []
    (tmp_path / "shared").mkdir(exist_ok=True)

    def start(name: str) -> Instance:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("LORE_")},
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
            "LORE_UPSTREAM_OPENAI": fake_upstream.url,
            "LORE_UPSTREAM_CHATGPT": fake_upstream.url + "/backend-api",
            "LORE_UPSTREAM_ANTHROPIC": fake_upstream.url,
            "LORE_DATA_DIR": str(tmp_path / name),
            "LORE_DATABASE_URL": shared_url,
            "LORE_EMBEDDINGS": "false",
            "LORE_WORKER": "true",
            "LORE_DISTILL_SEGMENT_TOKENS": "1",
            "LORE_DISTILL_IDLE_S": "3600",
            "LORE_WORKER_RETRY_BASE_S": "0.05",
            "LORE_EXPORT": "false",
        }
        instance = Instance(name, env)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.kill()


class Session:
    """One Claude-style conversation whose turns go to whichever instance is given."""

    def __init__(self, project: Path, name: str = "shared-session") -> None:
        self.system = SYSTEM + f"\nPrimary working directory: {project}"
        self.messages: list[dict[str, Any]] = []
        self.name = name

    def body(self, text: str, *, stream: bool = False) -> dict[str, Any]:
        self.messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
        return {"model": "claude-fake", "max_tokens": 256, "stream": stream,
                "system": self.system, "tools": TOOLS, "messages": self.messages}

    def say(self, via: Instance, text: str, scenario: str = "text:" + ANSWER) -> None:
        reply = post(via.url, self.body(text), scenario, self.name)
        self.messages.append({"role": "assistant", "content": orjson.loads(reply)["content"]})


def post(url: str, body: dict[str, Any], scenario: str,
         session: str = "shared-session") -> bytes:
    request = urllib.request.Request(
        url + "/v1/messages", data=orjson.dumps(body), method="POST",
        headers={"content-type": "application/json", "x-api-key": ANTHROPIC_KEY,
                 "anthropic-version": "2023-06-01", "x-lore-session-id": session,
                 "x-fake-scenario": scenario})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        data: bytes = resp.read()
    return data


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    database = parse_url(url)  # a pool of its own: closed here, not by the GC
    conn = db.connect(database)
    try:
        return [tuple(r) for r in conn.execute(sql, params).fetchall()]
    finally:
        conn.close()
        database.close()




def turns(url: str) -> int:
    """The session's stored client turns (distillations are turns of their own)."""
    return int(query(url, "SELECT count(*) FROM turns WHERE session = ? AND protocol != ?",
                     ("shared-session", DISTILL_PROTOCOL))[0][0])


def agent_requests(fake: FakeUpstream, since: int = 0) -> list[Any]:
    """The agent's requests upstream (not the worker's), from the ``since``-th on."""
    return [r for r in fake.model_requests[since:] if "x-lore-worker" not in r.headers]


def pair(follow_up: Any) -> bytes:
    """The tool-call pair a recall follow-up appended, as its body holds it."""
    appended = follow_up.json["messages"][-2:]
    assert appended[0]["content"][-1]["name"] == "recall"
    raw = orjson.dumps(appended)[1:-1]
    assert raw in follow_up.body
    return raw


def test_two_instances_serve_one_session_and_survive_losing_one(
        instances: Callable[[str], Instance], fake_upstream: FakeUpstream,
        shared_url: str, tmp_path: Path) -> None:
    import subprocess as sp

    project = tmp_path / "repo"
    project.mkdir()
    sp.run(["git", "init", "-q", str(project)], check=True)
    a, b = instances("a"), instances("b")
    session = Session(project)

    session.say(a, FACT)
    wait_until(lambda: turns(shared_url) >= 1, "the first turn stored via A", WAIT_S)

    # Recall via B finds what A stored.
    mark = len(fake_upstream.model_requests)
    session.say(b, "Where is the deploy key again?", "recall:deploy key vault")
    _, follow_b = agent_requests(fake_upstream, mark)
    assert b"tangerine-seven" in follow_b.body
    pair_b = pair(follow_b)
    wait_until(lambda: query(shared_url, "SELECT count(*) FROM recall_anchors")[0][0] >= 1,
               "B's recall anchor", WAIT_S)

    # A expands B's marker exactly, and recalls again.
    mark = len(fake_upstream.model_requests)
    session.say(a, "And who rotates it?", "recall:rotate deploy key")
    first_a, follow_a = agent_requests(fake_upstream, mark)
    assert b"lore-recall" not in first_a.body
    assert pair_b in first_a.body
    pair_a = pair(follow_a)
    wait_until(lambda: query(shared_url, "SELECT count(*) FROM recall_anchors")[0][0] >= 2,
               "A's recall anchor", WAIT_S)

    # B had the session cached since its own recall: it still expands A's marker.
    mark = len(fake_upstream.model_requests)
    session.say(b, "Thanks, carry on with the tests.")
    (plain_b,) = agent_requests(fake_upstream, mark)
    assert b"lore-recall" not in plain_b.body
    assert pair_b in plain_b.body and pair_a in plain_b.body

    wait_until(lambda: turns(shared_url) >= 4, "four turns stored", WAIT_S)
    said = [FACT, "Where is the deploy key again?", "And who rotates it?",
            "Thanks, carry on with the tests."]
    stored = [str(r[0]) for r in query(
        shared_url, "SELECT content FROM messages WHERE session = ? AND role = 'user'",
        ("shared-session",))]
    for text in said:
        assert sum(text in s for s in stored) == 1, f"{text!r} stored {stored}"

    # Background jobs: each ran once, on one of the two, and was saved once.
    def settled() -> bool:
        queued = query(shared_url, "SELECT count(*) FROM worker_jobs WHERE state = 'queued'")
        return int(queued[0][0]) == 0 and bool(query(
            shared_url, "SELECT count(*) FROM distillations WHERE method = 'worker'")[0][0])

    def distill_calls() -> int:
        return sum(r.headers.get("x-lore-worker") == "distill"
                   for r in fake_upstream.model_requests)

    wait_until(settled, "the distill jobs to finish", WAIT_S)
    # The idle trigger may queue one more job after ``settled``: every call counted
    # here has ended, saved, by the next ``settled``.
    calls_before = distill_calls()
    wait_until(settled, "the distill jobs to finish", WAIT_S)
    logs = query(shared_url, "SELECT source_ids FROM distillations WHERE generation = 0")
    sources = [i for (ids,) in logs for i in orjson.loads(ids)]
    assert len(sources) == len(set(sources)), "a message was distilled twice"
    worker_logs = query(shared_url, "SELECT count(*) FROM distillations WHERE generation = 0"
                        " AND method = 'worker'")[0][0]
    # One worker log per model call: none lost, none from a call made twice.
    assert calls_before <= worker_logs <= distill_calls()
    # Read after the logs: a job saves its log and ends in one transaction, so
    # no more logs than jobs ended. Fewer is allowed: a job may end with nothing
    # to save (its segment distilled meanwhile), and the idle trigger may queue
    # one more after ``settled``.
    done = query(shared_url, "SELECT count(*) FROM worker_jobs WHERE kind = 'distill'"
                 " AND state = 'done'")[0][0]
    assert 0 < len(logs) <= done

    # Kill A while it streams an answer; B keeps serving the session.
    stored_before = turns(shared_url)
    mark = len(fake_upstream.model_requests)
    request = urllib.request.Request(
        a.url + "/v1/messages", data=orjson.dumps(session.body("Stream me a long story.",
                                                                stream=True)),
        method="POST", headers={"content-type": "application/json",
                                "x-api-key": ANTHROPIC_KEY,
                                "anthropic-version": "2023-06-01",
                                "x-lore-session-id": "shared-session",
                                "x-fake-scenario": "stall"})
    response = urllib.request.urlopen(request, timeout=60)
    assert response.readline().startswith(b"event:")  # the stream is under way
    a.kill()
    with pytest.raises((OSError, http.client.HTTPException)):
        while response.read(65536):
            pass
    session.messages.pop()  # the client retries that turn elsewhere

    mark = len(fake_upstream.model_requests)
    session.say(b, "Stream me a long story.")
    (retried,) = agent_requests(fake_upstream, mark)
    assert pair_b in retried.body and pair_a in retried.body
    wait_until(lambda: turns(shared_url) >= stored_before + 1, "the retried turn via B", WAIT_S)
    stored_after = [str(r[0]) for r in query(
        shared_url, "SELECT content FROM messages WHERE session = ? AND role = 'user'",
        ("shared-session",))]
    for text in said:
        assert sum(text in s for s in stored_after) == 1


def test_a_knowledge_update_reaches_the_session_on_both_instances(
        instances: Callable[[str], Instance], fake_upstream: FakeUpstream,
        shared_url: str, tmp_path: Path) -> None:
    project = tmp_path / "repo"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    a, b = instances("a"), instances("b")

    def entries() -> int:
        return int(query(shared_url, "SELECT count(*) FROM knowledge")[0][0])

    Session(project, "earlier").say(a, "Decision: use uv for every Python command. pip is "
                                       "not allowed here.")
    wait_until(lambda: entries() >= 1, "the first entry", WAIT_S)
    mark = len(fake_upstream.model_requests)
    later = Session(project, "later")
    later.say(a, "Hello again.")  # A freezes the session's block
    later.say(b, "Decision: the API listens on port 8443. Port 8080 is taken by the proxy.")
    wait_until(lambda: entries() >= 2, "the mid-session entry", WAIT_S)
    later.say(a, "Thanks, go on.")
    later.say(b, "And now?")
    sent = [r.json for r in agent_requests(fake_upstream, mark)
            if b"Hello again." in r.body]
    assert len(sent) == 4
    assert all(x["system"] == sent[0]["system"] for x in sent)
    assert "use uv for every Python command" in sent[0]["system"]
    for earlier, nxt in itertools.pairwise(sent):
        prefix = nxt["messages"][:len(earlier["messages"])]
        assert orjson.dumps(prefix) == orjson.dumps(earlier["messages"])
    updates = [m for m in sent[-1]["messages"]
               if UPDATE_HEADING in orjson.dumps(m.get("content")).decode()]
    assert len(updates) == 1 and "port 8443" in orjson.dumps(updates[0]).decode(), \
        [m["role"] for m in sent[-1]["messages"]]


def test_a_log_distilled_while_the_other_instance_curates_is_curated_too(
        instances: Callable[[str], Instance], fake_upstream: FakeUpstream,
        shared_url: str, tmp_path: Path) -> None:
    """A curate job reads the project's uncurated logs when it starts. A log that the
    other instance distils while that job waits for the model cannot queue a curate
    job of its own (the running one holds the session's slot), so the running job
    must queue the next one when it finishes, or the decision is never learned."""
    project = tmp_path / "repo"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    a, b = instances("a"), instances("b")

    def count(table: str) -> int:
        return int(query(shared_url, f"SELECT count(*) FROM {table}")[0][0])

    curate = fake_upstream.hold_worker("curate")
    session = Session(project, "later")
    session.say(a, "Decision: use uv for every Python command. pip is not allowed here.")
    wait_until(lambda: [r for r in fake_upstream.model_requests
                        if r.headers.get("x-lore-worker") == "curate"],
               "A's curate request, held", WAIT_S)
    session.say(b, "Decision: the API listens on port 8443. Port 8080 is taken by the proxy.")
    wait_until(lambda: count("distillations") >= 2, "B's log", WAIT_S)
    curate.set()
    wait_until(lambda: count("knowledge") >= 2, "both decisions learned", WAIT_S)
    titles = " ".join(str(r[0]) for r in query(shared_url, "SELECT title FROM knowledge"))
    assert "8443" in titles and "uv" in titles, titles
