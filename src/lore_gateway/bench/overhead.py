"""``lore bench overhead``: what the gateway adds to a streamed request.

The fake upstream and the gateway run as separate processes, as in production;
this process is the client. Identical streamed Responses requests go to the
fake directly and through the gateway, alternating in small rounds so that
machine drift hits both paths alike, first one at a time (c=1), then with 16 in
flight (c=16). The figures that matter are the differences and ratios between
the two paths measured in the same run: absolute numbers move with the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REQUEST_BODY = (
    b'{"model":"gpt-bench","stream":true,"input":[{"role":"user","content":"say hi"}],'
    b'"tools":[{"type":"function","name":"read_file","parameters":{"type":"object",'
    b'"properties":{"path":{"type":"string"}}}}]}'
)
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-key"}

# ``progress(stage, done, total)``: the CLI draws it; None is silent.
Progress = Callable[[str, int, int], None]


@dataclass
class PathStats:
    """Latencies (seconds) of the requests sent down one path in one phase."""

    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    busy: float = 0.0  # wall time spent in this path's rounds
    errors: int = 0

    def summary(self) -> dict[str, float]:
        return {
            "requests": len(self.total),
            "errors": self.errors,
            "rps": len(self.total) / self.busy if self.busy else 0.0,
            "ttfb_p50_ms": _pct(self.ttfb, 50) * 1e3,
            "ttfb_p99_ms": _pct(self.ttfb, 99) * 1e3,
            "total_p50_ms": _pct(self.total, 50) * 1e3,
            "total_p99_ms": _pct(self.total, 99) * 1e3,
        }


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def running_servers(*, events: int, store: bool, recall_tool: bool,
                    data_dir: Path) -> Iterator[tuple[str, str, int]]:
    """Start the fake upstream and the gateway; yield (direct, gateway, gateway pid)."""
    fake_port, gw_port = free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    fake = subprocess.Popen(
        [sys.executable, "-m", "lore_gateway.testing.fake_upstream",
         "--port", str(fake_port), "--events", str(events)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    gw_env = {
        **env,
        "LORE_UPSTREAM_OPENAI": f"http://127.0.0.1:{fake_port}",
        "LORE_UPSTREAM_ANTHROPIC": f"http://127.0.0.1:{fake_port}",
        "LORE_DATA_DIR": str(data_dir),
        "LORE_STORE": "true" if store else "false",
        "LORE_RECALL": "true" if recall_tool else "false",
        "LORE_LOG_LEVEL": "warning",
    }
    gateway = subprocess.Popen(
        [sys.executable, "-m", "lore_gateway", "serve", "--port", str(gw_port)],
        env=gw_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(f"http://127.0.0.1:{fake_port}/v1/models", fake)
        _wait_http(f"http://127.0.0.1:{gw_port}/health", gateway)
        yield (f"http://127.0.0.1:{fake_port}", f"http://127.0.0.1:{gw_port}", gateway.pid)
    finally:
        for proc in (gateway, fake):
            proc.terminate()
        for proc in (gateway, fake):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _one(session: aiohttp.ClientSession, url: str, stats: PathStats,
               headers: dict[str, str]) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, data=REQUEST_BODY, headers=headers) as resp:
            first: float | None = None
            async for _ in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
            if resp.status != 200:
                stats.errors += 1
                return
    except aiohttp.ClientError:
        stats.errors += 1
        return
    end = time.perf_counter()
    stats.ttfb.append((first or end) - start)
    stats.total.append(end - start)


async def _round(session: aiohttp.ClientSession, url: str, stats: PathStats, n: int,
                 concurrency: int, headers: dict[str, str]) -> None:
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await _one(session, url, stats, headers)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.busy += time.perf_counter() - start


async def measure(direct: str, gateway: str, *, requests: int, concurrency: int,
                  round_size: int, warmup: int = 20,
                  headers: dict[str, str] | None = None,
                  progress: Progress | None = None) -> dict[str, PathStats]:
    """Alternate rounds of ``round_size`` requests between the two paths."""
    stage = f"requests at c={concurrency}"
    headers = headers or HEADERS
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        urls = {"direct": direct + "/v1/responses", "gateway": gateway + "/v1/responses"}
        for url in urls.values():
            await _round(session, url, PathStats(), warmup, concurrency, headers)
        stats = {name: PathStats() for name in urls}
        done = 0
        while done < requests:
            n = min(round_size, requests - done)
            for name, url in urls.items():
                await _round(session, url, stats[name], n, concurrency, headers)
            done += n
            if progress is not None:
                progress(stage, 2 * done, 2 * requests)
        return stats


def compare(stats: dict[str, PathStats]) -> dict[str, Any]:
    d, g = stats["direct"].summary(), stats["gateway"].summary()
    return {
        "direct": d,
        "gateway": g,
        "added_p50_ms": g["total_p50_ms"] - d["total_p50_ms"],
        "added_p99_ms": g["total_p99_ms"] - d["total_p99_ms"],
        "added_ttfb_p50_ms": g["ttfb_p50_ms"] - d["ttfb_p50_ms"],
        "latency_ratio_p50": g["total_p50_ms"] / d["total_p50_ms"] if d["total_p50_ms"] else 0.0,
        "throughput_ratio": g["rps"] / d["rps"] if d["rps"] else 0.0,
    }


def rss_bytes(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS) of a process, from /proc."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


async def big_stream(gateway: str, pid: int, megabytes: int,
                     progress: Progress | None = None) -> dict[str, float]:
    """Stream ``megabytes`` MiB through the gateway; report its peak-RSS growth."""
    _, peak_before = rss_bytes(pid)
    received = 0
    start = time.perf_counter()
    headers = {**HEADERS, "x-fake-scenario": f"big-stream:{megabytes}"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
        gateway + "/v1/responses", data=REQUEST_BODY, headers=headers
    ) as resp:
        async for chunk in resp.content.iter_any():
            received += len(chunk)
            if progress is not None:
                progress("big stream (MiB)", received >> 20, megabytes)
    elapsed = time.perf_counter() - start
    _, peak_after = rss_bytes(pid)
    return {
        "megabytes_received": received / 1e6,
        "seconds": elapsed,
        "peak_rss_growth_mb": (peak_after - peak_before) / 1e6,
    }


ANTHROPIC_HEADERS = {"content-type": "application/json", "x-api-key": "sk-ant-bench-not-a-key",
                     "anthropic-version": "2023-06-01"}


async def _stream_seconds(session: aiohttp.ClientSession, url: str, body: bytes,
                          headers: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    received = 0
    async with session.post(url, data=body, headers=headers) as resp:
        async for chunk in resp.content.iter_any():
            received += len(chunk)
        if resp.status != 200:
            raise RuntimeError(f"watched-stream bench got HTTP {resp.status}")
    return time.perf_counter() - start, received


async def watched_stream(gateway: str, megabytes: float, delta_bytes: int,
                         repeats: int) -> dict[str, float]:
    """An Anthropic answer of ``megabytes`` MiB in ``delta_bytes`` deltas through the
    gateway, recall-watched (the request offers a tool, so the gateway injects
    recall and watches the stream) against plain passthrough (no tool), alternating;
    medians and their ratio."""
    tool = {"name": "Read", "input_schema": {"type": "object", "properties": {}}}
    base = {"model": "claude-bench", "max_tokens": 1024, "stream": True,
            "messages": [{"role": "user", "content": "say a lot"}]}
    bodies = {"plain": json.dumps(base).encode(),
              "watched": json.dumps({**base, "tools": [tool]}).encode()}
    headers = {**ANTHROPIC_HEADERS, "x-fake-scenario": f"big-stream:{megabytes}@{delta_bytes}"}
    times: dict[str, list[float]] = {"plain": [], "watched": []}
    received = 0
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(repeats):
            for name, body in bodies.items():
                seconds, received = await _stream_seconds(
                    session, gateway + "/v1/messages", body, headers)
                times[name].append(seconds)
    plain, watched = (sorted(times[k])[len(times[k]) // 2] for k in ("plain", "watched"))
    return {"megabytes": megabytes, "delta_bytes": delta_bytes, "repeats": repeats,
            "bytes_received": received, "plain_s": plain, "watched_s": watched,
            "ratio": watched / plain if plain else 0.0}


def run_watched(*, megabytes: float, delta_bytes: int = 16, repeats: int = 5) -> dict[str, Any]:
    """The watched-stream benchmark alone, on its own servers (recall needs the
    store; both paths store their turn, so the difference is the interception)."""
    with tempfile.TemporaryDirectory(prefix="lore-bench-") as tmp, running_servers(
        events=41, store=True, recall_tool=True, data_dir=Path(tmp)
    ) as (_direct, gateway, _pid):
        return asyncio.run(watched_stream(gateway, megabytes, delta_bytes, repeats))


def run(*, requests_c1: int = 300, requests_c16: int = 600, events: int = 41,
        store: bool = True, recall_tool: bool = False, big_mb: int = 0,
        progress: Progress | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the figures (see ``lore bench overhead --help``)."""
    with tempfile.TemporaryDirectory(prefix="lore-bench-") as tmp, running_servers(
        events=events, store=store, recall_tool=recall_tool, data_dir=Path(tmp)
    ) as (direct, gateway, pid):
        c1 = asyncio.run(measure(direct, gateway, requests=requests_c1, concurrency=1,
                                 round_size=25, progress=progress))
        c16 = asyncio.run(measure(direct, gateway, requests=requests_c16, concurrency=16,
                                  round_size=100, progress=progress))
        result: dict[str, Any] = {
            "config": {"events": events, "store": store, "recall_tool": recall_tool,
                       "requests_c1": requests_c1, "requests_c16": requests_c16},
            "c1": compare(c1),
            "c16": compare(c16),
        }
        if big_mb:
            result["big_stream"] = asyncio.run(big_stream(gateway, pid, big_mb, progress))
        result["gateway_rss_mb"] = rss_bytes(pid)[0] / 1e6
    return result
