"""``lore bench soak``: many clients for a while, then a stop, and what it cost.

The fake upstream and the gateway (``lore serve``) run as their own processes,
as in production; this process drives ``clients`` concurrent agents, half of them
(``recall_share``) asking questions the model answers by calling the hidden
recall tool, so every such turn runs a search and a follow-up inside the
gateway. Every client has its own session and loops until the time is up.

Reported: errors (anything but a complete, well-formed stream), leaks (the
gateway's open file descriptors after the load against before it), latency by
kind, the gateway's RSS over time, turns stored against turns completed, and
how long the gateway took to exit on SIGTERM. So that a figure can be read
against the machine it came from, also the load average before and after, the
CPU each process used during the load (the gateway, its search and embedding
children, the fake upstream and this client, which all share the same cores),
and how late this client's own event loop ran (its lag: a starved client
would add its own queueing to every latency it measures). ``kill=True`` ends the gateway
with SIGKILL mid-load instead, restarts it on the same data dir and reports the
integrity check and the turns lost against the documented window
(docs/memory.md, "Durability").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import apsw

from lore_gateway.bench import procstat
from lore_gateway.bench.overhead import _pct, _wait_http, free_port, rss_bytes

RSS_SAMPLE_S = 2.0
# From here on the gateway's RSS should stay flat (within 10%): bounded caches fill
# during the first minute of a soak.
RSS_SETTLED_S = 60.0
# How often the client measures its own event loop's lag (a sleep's overshoot).
LAG_SAMPLE_S = 0.1
# aiohttp closes idle pooled upstream connections on a cleanup pass every 15 s,
# so an idle connection can live up to 30 s.
FD_SETTLE_S = 45.0
# A client that sees no byte for this long counts the request as an error.
CLIENT_TIMEOUT_S = 60.0
# Each client talks about its own topic (``topic<n>``), and recall asks for it,
# as an agent recalls its own project's decisions: a search matches that
# client's turns, not every stored row.
TEXT_BODY = (b'{"model":"gpt-soak","stream":true,"input":[{"role":"user","content":'
             b'"question %d about topic%d and its deployment"}]}')
# A recall the gateway refused (memory busy) or gave up on (timeout) still ends
# in a complete answer, so it is no error; it is counted apart, since a recall
# that never searched is not the latency being measured.
WITHOUT_MEMORY = (b"Recall is unavailable right now", b"Recall timed out")
RECALL_BODY = (b'{"model":"gpt-soak","stream":true,"input":[{"role":"user","content":'
               b'"what did we decide (%d) about topic%d?"}],"tools":[{"type":'
               b'"function","name":"read_file","parameters":{"type":"object"}}]}')


@dataclass
class Kind:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    without_memory: int = 0
    error_samples: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"completed": len(self.latencies), "errors": self.errors,
                "without_memory": self.without_memory,
                "p50_ms": round(_pct(self.latencies, 50) * 1e3, 1),
                "p99_ms": round(_pct(self.latencies, 99) * 1e3, 1),
                "max_ms": round(max(self.latencies, default=0.0) * 1e3, 1),
                "error_samples": self.error_samples[:3]}


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except FileNotFoundError:
        return 0


class _Servers:
    def __init__(self, data_dir: Path, *, embeddings: bool, grace: float) -> None:
        self.data_dir = data_dir
        self.fake_port, self.gw_port = free_port(), free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.fake = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway.testing.fake_upstream",
             "--port", str(self.fake_port), "--events", "41"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.gw_env = {**env, "LORE_UPSTREAM_OPENAI": f"http://127.0.0.1:{self.fake_port}",
                       "LORE_DATA_DIR": str(data_dir), "LORE_LOG_LEVEL": "warning",
                       "LORE_EMBEDDINGS": "true" if embeddings else "false",
                       "LORE_SHUTDOWN_GRACE": str(grace)}
        _wait_http(f"http://127.0.0.1:{self.fake_port}/v1/models", self.fake)
        self.gateway = self.start_gateway()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}"

    def start_gateway(self) -> subprocess.Popen[bytes]:
        log = (self.data_dir / "soak-gateway.log").open("ab")
        gateway = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway", "serve", "--port", str(self.gw_port)],
            env=self.gw_env, stdout=subprocess.DEVNULL, stderr=log)
        _wait_http(self.url + "/health", gateway)
        return gateway

    def close(self) -> None:
        for proc in (self.gateway, self.fake):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def _client(session: aiohttp.ClientSession, url: str, number: int, recall: bool,
                  until: float, kind: Kind, stop: asyncio.Event) -> None:
    headers = {"content-type": "application/json", "authorization": "Bearer sk-soak-not-a-key",
               "x-lore-session-id": f"soak-{number}"}
    if recall:
        headers["x-fake-scenario"] = f"recall:topic{number} decision"
    n = 0
    while time.monotonic() < until and not stop.is_set():
        body = (RECALL_BODY if recall else TEXT_BODY) % (n, number)
        n += 1
        started = time.perf_counter()
        try:
            async with session.post(url + "/v1/responses", data=body, headers=headers) as resp:
                data = await resp.read()
            ok = resp.status == 200 and b"event: response.completed" in data
            if ok and recall:
                # The hidden call never reaches the client, and the search answered
                # (a failed search still ends in a complete, apologetic answer).
                ok = b"function_call" not in data and b"Recall search failed" not in data
                if ok and any(text in data for text in WITHOUT_MEMORY):
                    kind.without_memory += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            if stop.is_set():
                return  # killed on purpose: not the gateway's error
            ok, data = False, repr(exc).encode()
        if ok:
            kind.latencies.append(time.perf_counter() - started)
        elif not stop.is_set():
            kind.errors += 1
            kind.error_samples.append(data[-200:].decode("utf-8", "replace"))


def _stored(db_path: Path) -> tuple[int, str]:
    """(complete soak turns stored, integrity check)."""
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        integrity = ",".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
        row = conn.execute(
            "SELECT count(*) FROM turns WHERE session LIKE 'soak-%' AND complete = 1").fetchone()
        return int(row[0]) if row else 0, integrity
    finally:
        conn.close()


async def _load(servers: _Servers, *, clients: int, seconds: float, recall_share: float,
                kill_at: float | None) -> dict[str, Any]:
    kinds = {"text": Kind(), "recall": Kind()}
    recall_clients = round(clients * recall_share)
    pid = servers.gateway.pid
    rss: list[tuple[float, float]] = []
    queue_depths: list[int] = []
    lags: list[float] = []
    cpu_end: list[_CPUReading] = []
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=clients + 8)
    started = time.monotonic()
    until = started + seconds
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        # Warm-up: one turn of each kind (the search process loads its model).
        for recall in (False, True):
            await _client(session, servers.url, 10_000 + recall, recall,
                          time.monotonic() + 0.001, Kind(), stop)
        fds_before = _fds(pid)
        cpu_before = _cpu(servers)
        tasks = [asyncio.create_task(_client(
            session, servers.url, i, i < recall_clients, until,
            kinds["recall" if i < recall_clients else "text"], stop)) for i in range(clients)]

        async def sample() -> None:
            while time.monotonic() < until and not stop.is_set():
                rss.append((round(time.monotonic() - started, 1), rss_bytes(pid)[0] / 1e6))
                with contextlib.suppress(aiohttp.ClientError, ValueError):
                    async with session.get(servers.url + "/metrics") as resp:
                        for line in (await resp.text()).splitlines():
                            if line.startswith("lore_storage_queue_depth "):
                                queue_depths.append(int(float(line.split()[1])))
                await asyncio.sleep(RSS_SAMPLE_S)

        async def killer() -> None:
            assert kill_at is not None
            await asyncio.sleep(kill_at)
            stop.set()
            cpu_end.append(_cpu(servers))  # the gateway's CPU up to the kill
            servers.gateway.send_signal(signal.SIGKILL)

        async def lag() -> None:
            while time.monotonic() < until and not stop.is_set():
                slept = time.perf_counter()
                await asyncio.sleep(LAG_SAMPLE_S)
                lags.append(max(0.0, time.perf_counter() - slept - LAG_SAMPLE_S))

        extra = [asyncio.create_task(sample()), asyncio.create_task(lag())]
        if kill_at is not None:
            extra.append(asyncio.create_task(killer()))
        await asyncio.gather(*tasks)
        cpu = _cpu_used(cpu_before, cpu_end[0] if cpu_end else _cpu(servers))
        for task in extra:
            task.cancel()
    # Pooled keep-alive connections (to the client and the upstream) close on
    # their own timers; a leak is what is still open once they had the time.
    deadline = time.monotonic() + FD_SETTLE_S
    while _fds(pid) > fds_before and time.monotonic() < deadline and kill_at is None:  # noqa: ASYNC110 (another process: nothing to await)
        await asyncio.sleep(1.0)
    fds_after = _fds(pid)
    return {"kinds": kinds, "rss": rss, "fds_before": fds_before, "fds_after": fds_after,
            "recall_clients": recall_clients, "queue_depths": queue_depths, "cpu": cpu,
            "client_lag_ms": {"p50": round(_pct(lags, 50) * 1e3, 1),
                              "p99": round(_pct(lags, 99) * 1e3, 1)}}


@dataclass(frozen=True, slots=True)
class _CPUReading:
    at: float
    gateway: procstat.TreeSample
    fake: procstat.TreeSample
    client: float


def _cpu(servers: _Servers) -> _CPUReading:
    return _CPUReading(time.monotonic(), procstat.sample(servers.gateway.pid),
                       procstat.sample(servers.fake.pid), time.process_time())


def _cpu_used(before: _CPUReading, after: _CPUReading) -> dict[str, float]:
    """CPU each part used during the load, in cores (CPU seconds per second)."""
    wall = max(after.at - before.at, 1e-9)
    gateway, gateway_tree = procstat.cpu_between(before.gateway, after.gateway)
    _, fake = procstat.cpu_between(before.fake, after.fake)
    return {"gateway": round(gateway / wall, 2),
            "gateway_children": round((gateway_tree - gateway) / wall, 2),
            "fake_upstream": round(fake / wall, 2),
            "client": round((after.client - before.client) / wall, 2)}


def _ratios(kinds: dict[str, Kind]) -> dict[str, float]:
    """Recall latency over text latency, at p50 and p99 (the same run, the same
    machine: the figure that survives a busy machine best)."""
    out: dict[str, float] = {}
    for p in (50, 99):
        text = _pct(kinds["text"].latencies, p)
        out[f"p{p}"] = round(_pct(kinds["recall"].latencies, p) / text, 2) if text else 0.0
    return out


def run(*, clients: int = 200, seconds: float = 60.0, recall_share: float = 0.5,
        embeddings: bool = True, grace: float = 10.0, kill: bool = False) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="lore-soak-") as tmp:
        servers = _Servers(Path(tmp), embeddings=embeddings, grace=grace)
        try:
            load = asyncio.run(_load(servers, clients=clients, seconds=seconds,
                                     recall_share=recall_share,
                                     kill_at=seconds / 2 if kill else None))
            load_after = os.getloadavg()[0]
            kinds: dict[str, Kind] = load["kinds"]
            completed = sum(len(k.latencies) for k in kinds.values())
            result: dict[str, Any] = {
                "config": {"clients": clients, "seconds": seconds,
                           "recall_clients": load["recall_clients"], "embeddings": embeddings,
                           "grace_s": grace, "kill": kill, "cpus": os.cpu_count(),
                           "loadavg": load_after, "loadavg_before": load_before},
                "text": kinds["text"].summary(),
                "recall": kinds["recall"].summary(),
                "recall_over_text": _ratios(kinds),
                "cpu_cores": load["cpu"],
                "client_lag_ms": load["client_lag_ms"],
                "errors": sum(k.errors for k in kinds.values()),
                "completed": completed,
                "rss_mb": load["rss"],
                "write_queue_max": max(load["queue_depths"], default=0),
            }
            rss = [mb for _, mb in load["rss"] if mb > 0]  # 0: the gateway had exited
            if len(rss) >= 4:
                settled = rss[len(rss) // 2]
                result["rss_growth_after_half"] = round(max(rss[len(rss) // 2:]) / settled - 1, 3)
            # Issue 10's reading: caches fill during the first minute, then RSS stays flat.
            later = [mb for t, mb in load["rss"] if t >= RSS_SETTLED_S and mb > 0]
            if len(later) >= 2:
                result["rss_growth_after_first_minute"] = round(max(later) / later[0] - 1, 3)
            db_path = Path(tmp) / "lore.db"
            if kill:
                servers.gateway.wait()
                servers.gateway = servers.start_gateway()
                stored, integrity = _stored(db_path)
                result.update(stored=stored, integrity=integrity,
                              lost_turns=max(0, completed - stored))
            else:
                result["fd_leak"] = load["fds_after"] - load["fds_before"]
            sent = time.monotonic()
            servers.gateway.send_signal(signal.SIGTERM)
            try:
                servers.gateway.wait(timeout=grace + 30)
            except subprocess.TimeoutExpired:
                servers.gateway.kill()
                servers.gateway.wait()
            result["shutdown_s"] = round(time.monotonic() - sent, 2)
            result["exit_code"] = servers.gateway.returncode
            if not kill:
                stored, integrity = _stored(db_path)
                result.update(stored=stored, integrity=integrity,
                              lost_turns=max(0, completed - stored))
            log = (Path(tmp) / "soak-gateway.log").read_text(errors="replace").splitlines()
            result["log_errors"] = sum("[error" in line for line in log)
            result["database_locked"] = sum("locked" in line for line in log)
        finally:
            servers.close()
    return result
