"""``lore bench overhead``: what the gateway adds to a streamed request, against a floor.

Three targets serve the same fake upstream, each in its own process as in
production: the fake itself (``direct``), a bare aiohttp streaming relay
(``relay``, :mod:`lore_gateway.bench.relay`: the floor any Python proxy pays)
and the gateway, with storage, embeddings and recall on as users run it. This
process is the client. For each protocol (Responses, Chat, Anthropic,
Gemini), plain and with one client tool (then the gateway injects recall and
watches the stream), identical streamed requests go to the three targets in
alternating rounds, first one at a time (c=1), then 16 in flight (c=16), so
machine drift hits all of them alike.

The figures that matter are the gateway's against the relay's from the same
run: its added latency (over ``direct``) minus the relay's, its requests/s and
CPU per request as a ratio of the relay's. Absolute numbers move with the
machine; these move much less.
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

from lore_gateway.bench import procstat

HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-key"}
ANTHROPIC_HEADERS = {"content-type": "application/json", "x-api-key": "sk-ant-bench-not-a-key",
                     "anthropic-version": "2023-06-01"}
GEMINI_HEADERS = {"content-type": "application/json", "x-goog-api-key": "gemini-bench-not-a-key"}
_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
PROTOCOLS = ("responses", "chat", "anthropic", "gemini")
SHAPES = ("plain", "tool")
TARGETS = ("direct", "relay", "gateway")

# The acceptance targets (issue 14), all with one client tool offered.
# Gemini's is the other messages protocols' (issue 35: the same targets).
ADDED_P50_LIMIT_MS = {"responses": 0.3, "chat": 0.5, "anthropic": 0.5,
                      "gemini": 0.5}  # over the relay's
MIN_RPS_RATIO_C16 = 0.8  # of the relay's

# ``progress(stage, done, total)``: the CLI draws it; None is silent.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class Workload:
    """One kind of request: a protocol, with or without a client tool."""

    protocol: str
    tool: bool
    path: str
    body: bytes
    headers: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.protocol}/{'tool' if self.tool else 'plain'}"


def workload(protocol: str, tool: bool) -> Workload:
    """The request a coding agent sends, reduced to one short user message."""
    message = [{"role": "user", "content": "say hi"}]
    if protocol == "responses":
        body: dict[str, Any] = {"model": "gpt-bench", "stream": True, "input": message}
        tools: list[Any] = [{"type": "function", "name": "read_file", "parameters": _SCHEMA}]
        path, headers = "/v1/responses", HEADERS
    elif protocol == "chat":
        # Agents on Chat Completions ask for usage; OpenAI then sends every
        # chunk a null usage and ends with one that carries it.
        body = {"model": "gpt-bench", "stream": True, "messages": message,
                "stream_options": {"include_usage": True}}
        tools = [{"type": "function", "function": {"name": "read_file", "parameters": _SCHEMA}}]
        path, headers = "/v1/chat/completions", HEADERS
    elif protocol == "anthropic":
        body = {"model": "claude-bench", "max_tokens": 1024, "stream": True, "messages": message}
        tools = [{"name": "read_file", "input_schema": _SCHEMA}]
        path, headers = "/v1/messages", ANTHROPIC_HEADERS
    elif protocol == "gemini":
        # The model is in the path; the stream is SSE, as the SDKs ask for it.
        body = {"contents": [{"role": "user", "parts": [{"text": "say hi"}]}]}
        tools = [{"functionDeclarations": [{"name": "read_file", "parameters": _SCHEMA}]}]
        path = "/v1beta/models/gemini-bench:streamGenerateContent?alt=sse"
        headers = GEMINI_HEADERS
    else:
        raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    if tool:
        body["tools"] = tools
    return Workload(protocol, tool, path, json.dumps(body).encode(), headers)


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


def _wait_children_started(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until each process the gateway started has named itself (``lore-store``,
    ``lore-embed``, ``lore-search``): one still starting would spend its start
    (an interpreter, the embedding model) inside the measured rounds, and its
    CPU would be counted under its interpreter's name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tree = procstat.sample(proc.pid)
        if all(name.startswith("lore-") or not name  # (empty: already gone)
               for pid, name in tree.names.items() if pid != proc.pid):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the gateway's processes did not start within {timeout} s")


@dataclass(frozen=True, slots=True)
class Servers:
    """Base URLs of the three targets, and the pids of the two that are measured."""

    urls: dict[str, str]
    pids: dict[str, int]


@contextlib.contextmanager
def running_servers(*, events: int, store: bool, data_dir: Path,
                    relay: bool = True) -> Iterator[Servers]:
    """Start the fake upstream, the bare relay and the gateway, each its own process."""
    fake_port, relay_port, gw_port = free_port(), free_port(), free_port()
    fake_url = f"http://127.0.0.1:{fake_port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = {"direct": subprocess.Popen(
        [sys.executable, "-m", "lore_gateway.testing.fake_upstream",
         "--port", str(fake_port), "--events", str(events)], env=env, **quiet)}
    if relay:
        procs["relay"] = subprocess.Popen(
            [sys.executable, "-m", "lore_gateway.bench.relay", "--port", str(relay_port),
             "--upstream", fake_url], env=env, **quiet)
    gw_env = {
        **env,
        "LORE_UPSTREAM_OPENAI": fake_url,
        "LORE_UPSTREAM_ANTHROPIC": fake_url,
        "LORE_UPSTREAM_GEMINI": fake_url,
        "LORE_DATA_DIR": str(data_dir),
        "LORE_STORE": "true" if store else "false",
        "LORE_LOG_LEVEL": "warning",
    }
    procs["gateway"] = subprocess.Popen(
        [sys.executable, "-m", "lore_gateway", "serve", "--port", str(gw_port)],
        env=gw_env, **quiet)
    urls = {"direct": fake_url, "relay": f"http://127.0.0.1:{relay_port}",
            "gateway": f"http://127.0.0.1:{gw_port}"}
    try:
        _wait_http(fake_url + "/v1/models", procs["direct"])
        if relay:
            _wait_http(urls["relay"] + "/v1/models", procs["relay"])
        _wait_http(urls["gateway"] + "/health", procs["gateway"])
        _wait_children_started(procs["gateway"])
        yield Servers({k: v for k, v in urls.items() if k in procs},
                      {k: p.pid for k, p in procs.items() if k != "direct"})
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def _one(session: aiohttp.ClientSession, url: str, work: Workload,
               stats: PathStats) -> None:
    start = time.perf_counter()
    try:
        async with session.post(url, data=work.body, headers=work.headers) as resp:
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


async def _round(session: aiohttp.ClientSession, url: str, work: Workload, stats: PathStats,
                 n: int, concurrency: int) -> None:
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await _one(session, url, work, stats)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    stats.busy += time.perf_counter() - start


@dataclass
class Measured:
    """One workload at one concurrency: per target, its latencies and the CPU its
    process tree used over the whole interleaved run (background work included)."""

    stats: dict[str, PathStats]
    cpu: dict[str, tuple[float, float]]  # target -> (root, tree) CPU seconds
    cpu_parts: dict[str, dict[str, float]]  # target -> process name -> CPU seconds


async def measure(servers: Servers, work: Workload, *, requests: int, concurrency: int,
                  round_size: int, warmup: int = 20, progress: Progress | None = None,
                  stage: str = "") -> Measured:
    """Alternate rounds of ``round_size`` requests between the targets, rotating
    which goes first, so that no target always follows the same one."""
    targets = list(servers.urls)
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        for name in targets:
            await _round(session, servers.urls[name] + work.path, work, PathStats(),
                         warmup, concurrency)
        stats = {name: PathStats() for name in targets}
        before = {name: procstat.sample(pid) for name, pid in servers.pids.items()}
        done = turn = 0
        while done < requests:
            n = min(round_size, requests - done)
            order = targets[turn % len(targets):] + targets[:turn % len(targets)]
            for name in order:
                await _round(session, servers.urls[name] + work.path, work, stats[name], n,
                             concurrency)
            done += n
            turn += 1
            if progress is not None:
                progress(stage, done, requests)
        after = {name: procstat.sample(pid) for name, pid in servers.pids.items()}
    cpu = {name: procstat.cpu_between(before[name], after[name]) for name in servers.pids}
    parts = {name: procstat.cpu_by_process(before[name], after[name]) for name in servers.pids}
    return Measured(stats, cpu, parts)


def compare(measured: Measured) -> dict[str, Any]:
    """Per target its summary and added latency over ``direct``; then the gateway
    against the relay, as a difference and as a ratio."""
    direct = measured.stats["direct"].summary()
    out: dict[str, Any] = {"direct": direct}
    for name, stats in measured.stats.items():
        if name == "direct":
            continue
        s: dict[str, Any] = dict(stats.summary())
        s["added_p50_ms"] = s["total_p50_ms"] - direct["total_p50_ms"]
        s["added_p99_ms"] = s["total_p99_ms"] - direct["total_p99_ms"]
        s["added_ttfb_p50_ms"] = s["ttfb_p50_ms"] - direct["ttfb_p50_ms"]
        s["rps_vs_direct"] = _ratio(s["rps"], direct["rps"])
        root, tree = measured.cpu.get(name, (0.0, 0.0))
        n = max(1, int(s["requests"]))
        s["cpu_ms_per_request"] = tree * 1e3 / n
        s["cpu_ms_per_request_main"] = root * 1e3 / n
        s["cpu_ms_per_request_by_process"] = {
            process: seconds * 1e3 / n
            for process, seconds in measured.cpu_parts.get(name, {}).items()}
        out[name] = s
    if "relay" in out and "gateway" in out:
        r, g = out["relay"], out["gateway"]
        out["gateway_vs_relay"] = {
            "added_p50_diff_ms": g["added_p50_ms"] - r["added_p50_ms"],
            "added_p99_diff_ms": g["added_p99_ms"] - r["added_p99_ms"],
            "added_p50_ratio": _ratio(g["added_p50_ms"], r["added_p50_ms"]),
            "added_p99_ratio": _ratio(g["added_p99_ms"], r["added_p99_ms"]),
            "rps_ratio": _ratio(g["rps"], r["rps"]),
            "cpu_ms_diff": g["cpu_ms_per_request"] - r["cpu_ms_per_request"],
            "cpu_ratio": _ratio(g["cpu_ms_per_request"], r["cpu_ms_per_request"]),
        }
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The acceptance checks of issue 14 (one client tool offered) on one run."""
    checks: list[dict[str, Any]] = []
    for protocol in PROTOCOLS:
        key = f"{protocol}/tool"
        c1 = result.get("c1", {}).get(key, {}).get("gateway_vs_relay")
        if c1 is not None:
            limit = ADDED_P50_LIMIT_MS[protocol]
            checks.append({"check": f"c=1 {key}: added p50 over the relay's", "unit": "ms",
                           "value": c1["added_p50_diff_ms"], "limit": f"<= {limit}",
                           "met": c1["added_p50_diff_ms"] <= limit})
        c16 = result.get("c16", {}).get(key, {}).get("gateway_vs_relay")
        if c16 is not None and c16["rps_ratio"] is not None:
            checks.append({"check": f"c=16 {key}: req/s as a ratio of the relay's", "unit": "x",
                           "value": c16["rps_ratio"], "limit": f">= {MIN_RPS_RATIO_C16}",
                           "met": c16["rps_ratio"] >= MIN_RPS_RATIO_C16})
    return checks


def rss_bytes(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS) of a process, from /proc."""
    s = procstat.sample(pid)
    return s.root_rss, s.root_peak


def _memory(servers: Servers) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, pid in servers.pids.items():
        s = procstat.sample(pid)
        out[name] = {"peak_rss_mb": s.root_peak / 1e6, "rss_mb": s.root_rss / 1e6,
                     "tree_peak_rss_mb": s.tree_peak / 1e6, "tree_rss_mb": s.tree_rss / 1e6,
                     "processes": len(s.cpu)}
    return out


def run(*, requests_c1: int = 300, requests_c16: int = 3000, events: int = 41,
        store: bool = True, protocols: tuple[str, ...] = PROTOCOLS,
        shapes: tuple[str, ...] = SHAPES, concurrencies: tuple[int, ...] = (1, 16),
        big_mb: int = 0, progress: Progress | None = None) -> dict[str, Any]:
    """The whole benchmark; returns the figures (see ``lore bench overhead --help``)."""
    works = [workload(p, s == "tool") for p in protocols for s in shapes]
    result: dict[str, Any] = {
        "config": {"events": events, "store": store, "requests_c1": requests_c1,
                   "requests_c16": requests_c16, "protocols": list(protocols),
                   "shapes": list(shapes), "cpus": os.cpu_count(),
                   "load_before": list(os.getloadavg())},
    }
    with tempfile.TemporaryDirectory(prefix="lore-bench-") as tmp, running_servers(
        events=events, store=store, data_dir=Path(tmp)
    ) as servers:
        for c in concurrencies:
            phase: dict[str, Any] = {}
            for work in works:
                measured = asyncio.run(measure(
                    servers, work, requests=requests_c1 if c == 1 else requests_c16,
                    concurrency=c, round_size=25 if c == 1 else 100, progress=progress,
                    stage=f"c={c} {work.name}"))
                phase[work.name] = compare(measured)
            result[f"c{c}"] = phase
        result["memory"] = _memory(servers)
        if big_mb:
            result["big_stream"] = asyncio.run(
                big_stream(servers.urls["gateway"], servers.pids["gateway"], big_mb, progress))
    result["config"]["load_after"] = list(os.getloadavg())
    result["targets"] = targets(result)
    return result


async def big_stream(gateway: str, pid: int, megabytes: int,
                     progress: Progress | None = None) -> dict[str, float]:
    """Stream ``megabytes`` MiB through the gateway; report its peak-RSS growth."""
    _, peak_before = rss_bytes(pid)
    received = 0
    start = time.perf_counter()
    work = workload("responses", True)
    headers = {**work.headers, "x-fake-scenario": f"big-stream:{megabytes}"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.post(
        gateway + work.path, data=work.body, headers=headers
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
    bodies = {"plain": workload("anthropic", False).body,
              "watched": workload("anthropic", True).body}
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
        events=41, store=True, data_dir=Path(tmp), relay=False
    ) as servers:
        return asyncio.run(watched_stream(servers.urls["gateway"], megabytes, delta_bytes,
                                          repeats))
