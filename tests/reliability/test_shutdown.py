"""Shutdown always ends (issue 10 point 2, issue 15 point 3).

SIGTERM with a stalled stream open: the stream gets its protocol's error event
at the grace, the turns are written, and the process exits. A second signal
exits at once, and the database is intact afterwards. An embedding backlog
never holds the exit.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import openai
import orjson
import pytest

from lore_gateway.testing import OPENAI_KEY, FakeUpstream

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 1.0
# Generous bounds for a shared, loaded CI machine; the bench measures the real figure.
EXIT_SLACK_S = 8.0


class Served:
    def __init__(self, url: str, process: subprocess.Popen[bytes], data_dir: Path) -> None:
        self.url, self.process, self.data_dir = url, process, data_dir


@pytest.fixture
def served(fake_upstream: FakeUpstream, tmp_path: Path) -> Iterator[Served]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORE_")}
    env.update(PYTHONPATH=str(REPO / "src"), LORE_UPSTREAM_OPENAI=fake_upstream.url,
               LORE_UPSTREAM_ANTHROPIC=fake_upstream.url, LORE_DATA_DIR=str(tmp_path / "data"),
               LORE_EMBEDDINGS="false", LORE_SHUTDOWN_GRACE=str(GRACE_S))
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "lore_gateway", "serve", "--port", "0"],
                               env=env, stdout=subprocess.DEVNULL, stderr=log)
    url = None
    deadline = time.monotonic() + 30
    while url is None:
        assert time.monotonic() < deadline and process.poll() is None, "lore serve did not start"
        found = re.search(rb"listening on (http://127\.0\.0\.1:\d+)",
                          (tmp_path / "serve.log").read_bytes())
        url = found.group(1).decode() if found else None
        time.sleep(0.05)
    yield Served(url, process, tmp_path / "data")
    if process.poll() is None:
        process.kill()
        process.wait()
    log.close()


def stalled_stream(served: Served, fake: FakeUpstream, got: list[bytes],
                   started: threading.Event) -> threading.Thread:
    """A streamed Responses request whose upstream goes silent after 3 frames."""

    def run() -> None:
        host, port = served.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/responses", body=orjson.dumps({
            "model": "gpt-x", "input": "a question that stalls", "stream": True}),
            headers={"authorization": f"Bearer {OPENAI_KEY}", "x-fake-scenario": "stall",
                     "content-type": "application/json", "x-lore-session-id": "stalled"})
        response = conn.getresponse()
        with contextlib.suppress(OSError, http.client.HTTPException):
            while chunk := response.read1(65536):
                got.append(chunk)
                started.set()
        started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def turns(data_dir: Path) -> list[tuple[str, int]]:
    conn = apsw.Connection(str(data_dir / "lore.db"), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(10_000)  # as every reader of ours: a writer may be finishing
    try:
        assert [r[0] for r in conn.execute("PRAGMA integrity_check")] == ["ok"]
        return [(str(r[0]), int(r[1])) for r in conn.execute(
            "SELECT session, complete FROM turns ORDER BY id")]
    finally:
        conn.close()


def test_sigterm_ends_a_stalled_stream_with_an_error_event_and_stores_the_turns(
    served: Served, fake_upstream: FakeUpstream,
) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=OPENAI_KEY, max_retries=0,
                           default_headers={"x-lore-session-id": "finished"})
    client.responses.create(model="gpt-x", input="a question that finishes")
    got: list[bytes] = []
    started = threading.Event()
    thread = stalled_stream(served, fake_upstream, got, started)
    assert started.wait(30)
    sent = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(timeout=GRACE_S + EXIT_SLACK_S) == 0
    took = time.monotonic() - sent
    thread.join(10)
    body = b"".join(got)
    assert body.rstrip().endswith(b"}"), body[-300:]
    last = body.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: response.failed")
    event = orjson.loads(last.split(b"data: ", 1)[1])
    assert "shutting down" in event["response"]["error"]["message"]
    assert took >= GRACE_S * 0.9  # the stream was given its grace
    assert turns(served.data_dir) == [("finished", 1), ("stalled", 0)]


def test_a_second_signal_exits_at_once_and_the_database_is_intact(
    served: Served, fake_upstream: FakeUpstream,
) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key=OPENAI_KEY, max_retries=0,
                           default_headers={"x-lore-session-id": "before"})
    client.responses.create(model="gpt-x", input="stored before the signals")
    # Committed before the signals: a second signal loses only what is still queued.
    deadline = time.monotonic() + 30
    while not (served.data_dir / "lore.db").exists() or ("before", 1) not in turns(
            served.data_dir):
        assert time.monotonic() < deadline, "the first turn was never committed"
        time.sleep(0.05)
    got: list[bytes] = []
    started = threading.Event()
    stalled_stream(served, fake_upstream, got, started)
    assert started.wait(30)
    helpers = [int(c) for task in Path(f"/proc/{served.process.pid}/task").iterdir()
               for c in (task / "children").read_text().split()]
    served.process.send_signal(signal.SIGTERM)
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(timeout=EXIT_SLACK_S) == 130
    # The storage process writes what it had received once the pipe closes, then exits.
    deadline = time.monotonic() + 20
    while any(running(pid) for pid in helpers):
        assert time.monotonic() < deadline, "a helper process outlived the gateway"
        time.sleep(0.05)
    assert ("before", 1) in turns(served.data_dir)


def test_an_embedding_backlog_never_holds_the_exit(tmp_path: Path) -> None:
    """The feeder thread of a full job queue used to block interpreter exit."""
    script = f"""
import sys, time
sys.path.insert(0, {str(REPO / "src")!r})
from pathlib import Path
from lore_gateway.storage import db, schema
from lore_gateway.memory.embed.process import EmbeddingProcess
path = Path({str(tmp_path / "lore.db")!r})
conn = db.connect(path); schema.migrate(conn); conn.close()
worker = EmbeddingProcess(path)
for start in range(0, 200_000, 20):
    worker.submit(list(range(start, start + 20)))
worker.close(timeout=1.0)
print("closed", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "closed" in done.stdout
