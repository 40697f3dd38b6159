"""The embedding backlog waits for a quiet moment of the proxy's, boundedly
(memory/store/traffic.py): the clock is shared with a child process, the wait ends at
the quiet or at its bound, vectors still arrive under continuous traffic, and
the gateway marks the requests it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lore_gateway.config import Settings
from lore_gateway.memory.embed.model_files import model_info
from lore_gateway.memory.service import Memory
from lore_gateway.memory.store.records import Identity, TurnRecord
from lore_gateway.memory.store.traffic import CpuPressure, TrafficClock, busy
from lore_gateway.protocols.common import Message
from lore_gateway.storage import db
from lore_gateway.testing import OPENAI_KEY

needs_model = pytest.mark.skipif(model_info() is None, reason="embedding model not installed")


def test_a_child_process_reads_the_marks_of_its_parent() -> None:
    clock = TrafficClock()
    try:
        clock.mark()
        marked = clock.last_mark_ns()
        script = ("import sys; from lore_gateway.memory.store.traffic import TrafficClock; "
                  "print(TrafficClock(int(sys.argv[1])).last_mark_ns())")
        out = subprocess.run([sys.executable, "-c", script, str(clock.fd)], pass_fds=(clock.fd,),
                             capture_output=True, text=True, timeout=60, check=True)
        assert int(out.stdout) == marked > 0
    finally:
        clock.close()
    clock.mark()  # a request ending after the memory closed (shutdown) is harmless


@pytest.fixture
def marking() -> Iterator[tuple[TrafficClock, threading.Event]]:
    """A clock and a thread marking it every millisecond until the event is set."""
    clock = TrafficClock()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            clock.mark()
            time.sleep(0.001)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield clock, stop
    stop.set()
    thread.join()
    clock.close()


def test_the_wait_ends_at_the_quiet_or_at_its_bound(
        marking: tuple[TrafficClock, threading.Event]) -> None:
    clock, stop = marking
    # Marks every millisecond: never 200 ms of quiet, so the bound ends the wait.
    waited = clock.wait_quiet(quiet_s=0.2, max_wait_s=0.1)
    assert 0.1 <= waited < 1.0
    stop.set()
    time.sleep(0.01)
    clock.mark()
    waited = clock.wait_quiet(quiet_s=0.05, max_wait_s=5.0)
    assert 0.03 <= waited < 2.0  # the quiet ended it, long before the bound
    fresh = TrafficClock()
    try:
        assert fresh.wait_quiet(quiet_s=0.05, max_wait_s=5.0) < 0.05  # never marked
    finally:
        fresh.close()


def _vectors(settings: Settings) -> int:
    conn = db.connect(settings.database)
    try:
        return int(conn.execute("SELECT count(*) FROM embeddings").fetchone()[0])
    finally:
        conn.close()


@needs_model
@pytest.mark.usefixtures("database_url")
def test_messages_are_embedded_while_requests_keep_coming(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    ident = Identity("tenant-a", "proj-x", "s1")
    texts = [f"Message {n}: the deploy script needs the staging credentials rotated."
             for n in range(6)]
    memory = Memory.open(settings, embedder="auto")
    clock = memory.traffic
    assert clock is not None
    stop = threading.Event()

    def traffic() -> None:  # a request every 2 ms, for as long as the test runs
        while not stop.is_set():
            clock.mark()
            time.sleep(0.002)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        for text in texts:
            assert memory.submit_turn(TurnRecord(identity=ident, protocol="chat", model=None,
                                                 messages=(Message("user", text),),
                                                 created_at=1.7e9))
        memory.flush(120)
        assert _vectors(settings) == len(texts)
    finally:
        stop.set()
        thread.join()
        memory.close()


@needs_model
async def test_the_gateway_marks_each_request_it_serves(
        make_gateway: Callable[..., Any]) -> None:
    gw = make_gateway(embeddings=True)
    clock = gw.memory.traffic
    assert clock is not None
    before = clock.last_mark_ns()
    body = {"model": "gpt-test", "input": "say hi", "stream": True}
    async with aiohttp.ClientSession() as session, session.post(
            gw.url + "/v1/responses", json=body,
            headers={"authorization": f"Bearer {OPENAI_KEY}"}) as resp:
        assert resp.status == 200
        during = clock.last_mark_ns()  # marked when the request began
        await resp.read()
    assert before < during <= clock.last_mark_ns()


class StallFile:
    """A stand-in for ``/proc/pressure/cpu`` whose stall total a thread can grow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.total = 0
        self.write()

    def write(self) -> None:
        """In place, at a fixed length: a reader never sees the file empty."""
        text = (f"some avg10=0.00 avg60=0.00 avg300=0.00 total={self.total:020d}\n"
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").encode()
        with open(self.path, "r+b" if self.path.exists() else "wb") as f:
            f.write(text)


def test_a_busy_machine_holds_the_backlog_to_its_bound_and_an_idle_one_not(
        tmp_path: Path) -> None:
    stall = StallFile(tmp_path / "cpu")
    pressure = CpuPressure(str(stall.path))
    clock = TrafficClock()  # the proxy never marked: quiet
    try:
        # No task waited for a CPU: one quiet stretch and it goes on.
        assert clock.wait_quiet(quiet_s=0.02, max_wait_s=5.0, pressure=pressure) < 2.0
        stop = threading.Event()

        def saturate() -> None:  # tasks waiting for a CPU all the time
            while not stop.is_set():
                stall.total += 1_000_000  # a second per tick: any tick makes a window busy
                stall.write()
                time.sleep(0.002)

        thread = threading.Thread(target=saturate, daemon=True)
        thread.start()
        try:
            waited = clock.wait_quiet(quiet_s=0.05, max_wait_s=0.3, pressure=pressure)
        finally:
            stop.set()
            thread.join()
        assert 0.3 <= waited < 2.0  # never a stall-free stretch: the bound ended it
        assert clock.wait_quiet(quiet_s=0.02, max_wait_s=0.3) < 0.3  # the proxy alone: quiet
    finally:
        pressure.close()
        clock.close()


@pytest.mark.skipif(CpuPressure().stall_us() is None, reason="the kernel has no PSI")
def test_the_machine_reads_busy_while_more_programs_spin_than_it_has_cores() -> None:
    pressure = CpuPressure()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range((os.cpu_count() or 1) + 2)]
    try:
        time.sleep(0.2)
        began, before = time.monotonic_ns(), pressure.stall_us()
        time.sleep(0.3)
        assert busy(pressure.stall_us(), before, time.monotonic_ns() - began)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        pressure.close()
    assert not busy(None, 0, 10**9) and not busy(10, None, 10**9)
