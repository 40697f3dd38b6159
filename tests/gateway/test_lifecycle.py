"""``lore serve`` stops cleanly: queued turns are written, no process is left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.service import Memory
from lore_gateway.testing import FakeUpstream

REPO = Path(__file__).resolve().parents[2]
Served = tuple[str, "subprocess.Popen[str]", Path]


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(c) for c in text)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def served(fake_upstream: FakeUpstream, tmp_path: Path) -> Iterator[Served]:
    """A real ``lore serve`` with the embedding model on (its own child process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORE_")}
    env.update(LORE_UPSTREAM_OPENAI=fake_upstream.url, LORE_DATA_DIR=str(tmp_path / "data"),
               PYTHONPATH=str(REPO / "src"))
    process = subprocess.Popen([sys.executable, "-m", "lore_gateway", "serve", "--port", "0"],
                               env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True)
    assert process.stderr is not None
    url = None
    deadline = time.monotonic() + 30
    while url is None and time.monotonic() < deadline:
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", process.stderr.readline())
        url = match.group(1) if match else None
    assert url is not None, "lore serve did not start"
    yield url, process, tmp_path / "data"
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_sigterm_writes_queued_turns_and_stops_the_embedding_process(
    served: Served,
) -> None:
    url, process, data_dir = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-lifecycle-test", max_retries=0)
    for i in range(5):
        client.responses.create(model="m", input=f"lifecycle fact number {i}")
    embedders = children(process.pid)
    assert embedders, "the embedding model runs in a child process"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    # multiprocessing's resource tracker leaves once it reads EOF from the exited
    # gateway, a moment later on a busy machine: wait for that, bounded.
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in embedders) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in embedders)
    memory = Memory.open(Settings(data_dir=data_dir, embeddings=False), embedder=None)
    try:
        assert memory.count_turns(None, session=None, project="unknown") >= 5
    finally:
        memory.close()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_the_embedding_process_exits_when_the_gateway_is_killed(
    served: Served,
) -> None:
    _, process, _ = served
    embedders = children(process.pid)
    assert embedders
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in embedders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in embedders)
