"""``lore bench footprint``: what a serving gateway keeps resident, process by process.

The gateway (``lore serve``) runs as in production, with its helper processes
(the embedding process, which also answers searches, the storage process, and
search processes if ``LORE_SEARCH_WORKERS`` asks for them), against the fake
upstream. The bench stores ``turns`` turns through it (one in ``recall_every``
calls recall, so the model loads and searches run), waits until the embedding
process has caught up, and reads every process of the gateway's tree from
``/proc``:

* **RSS**: resident pages, shared ones (libraries, the page cache of files they
  map) counted in every process that maps them; the sum over-counts.
* **PSS**: each shared page divided among the processes sharing it; the sum is
  what the tree costs the machine.
* **peak**: the largest RSS each process had (``VmHWM``).

Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from lore_gateway.bench.soak import RECALL_BODY, _Servers
from lore_gateway.config import Settings
from lore_gateway.storage import db

# Concurrent clients storing the turns: enough to overlap streams, few enough
# that the machine's load does not decide the figures.
CONCURRENCY = 8
# A turn's user text, varied so the embedder sees realistic lengths (~40-400
# tokens) and BM25 distinct terms.
WORDS = ("deploy", "migration", "cache", "retry", "index", "schema", "token", "socket",
         "parser", "worker", "budget", "timeout", "vector", "session", "anchor", "replay")
# The embedder has caught up once no vector was added for this long (messages
# without text to embed never get one). Long: at nice 19 on a loaded machine the
# embedder can get no CPU for tens of seconds (a 15 s wait measured mid-backlog).
STALL_S = 60.0


def _text(n: int) -> str:
    words = [WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(20 + (n * 37) % 180)]
    return f"turn {n}: " + " ".join(f"{w}{(n + i) % 97}" for i, w in enumerate(words))


def _children(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_memory(pid: int) -> dict[str, Any]:
    """One process's name, RSS, PSS, USS and peak RSS, in MiB."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0])
    peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1])
    name = Path(f"/proc/{pid}/comm").read_text().strip()
    mib = 1024.0
    return {"pid": pid, "name": name, "rss_mib": round(fields.get("Rss", 0) / mib, 1),
            "pss_mib": round(fields.get("Pss", 0) / mib, 1),
            "uss_mib": round((fields.get("Private_Clean", 0)
                              + fields.get("Private_Dirty", 0)) / mib, 1),
            "peak_rss_mib": round(peak / mib, 1)}


def tree_memory(pid: int) -> dict[str, Any]:
    """Every process of ``pid``'s tree and the totals."""
    processes = []
    for member in [pid, *_children(pid)]:
        try:
            processes.append(process_memory(member))
        except OSError:
            continue  # ended while we looked
    return {"processes": processes,
            "rss_mib": round(sum(p["rss_mib"] for p in processes), 1),
            "pss_mib": round(sum(p["pss_mib"] for p in processes), 1)}


def _counts(data_dir: Path) -> tuple[int, int, int]:
    """(turns stored, messages, messages with a vector), in the database the gateway
    writes (the SQLite file in ``data_dir``, or ``LORE_DATABASE_URL``)."""
    conn = db.connect(Settings(data_dir=data_dir).database, readonly=True)
    try:
        turns = conn.execute("SELECT count(*) FROM turns").fetchone()
        messages = conn.execute("SELECT count(*) FROM messages").fetchone()
        vectors = conn.execute("SELECT count(*) FROM embeddings").fetchone()
        return (int(turns[0]) if turns else 0, int(messages[0]) if messages else 0,
                int(vectors[0]) if vectors else 0)
    finally:
        conn.close()


async def _store(url: str, turns: int, recall_every: int) -> int:
    """Send ``turns`` turns; the number that failed."""
    failed = 0
    numbers = iter(range(turns))
    timeout = aiohttp.ClientTimeout(total=120)

    async def client(session: aiohttp.ClientSession, slot: int) -> None:
        nonlocal failed
        headers = {"content-type": "application/json",
                   "authorization": "Bearer sk-bench-not-a-key",
                   "x-lore-session-id": f"footprint-{slot}"}
        for n in numbers:
            recall = recall_every > 0 and n % recall_every == recall_every - 1
            if recall:
                body = RECALL_BODY % (n, slot)
                extra = {"x-fake-scenario": f"recall:{WORDS[n % len(WORDS)]}"}
            else:
                body = (b'{"model":"gpt-bench","stream":true,"input":[{"role":"user",'
                        b'"content":"%s"}]}' % _text(n).encode())
                extra = {}
            async with session.post(url + "/v1/responses", data=body,
                                    headers={**headers, **extra}) as resp:
                data = await resp.read()
            if resp.status != 200 or b"response.completed" not in data:
                failed += 1

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session, slot) for slot in range(CONCURRENCY)))
    return failed


def run(*, turns: int = 1000, recall_every: int = 10, embeddings: bool = True,
        settle: float = 300.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lore-footprint-") as tmp:
        servers = _Servers(Path(tmp), embeddings=embeddings, grace=5.0)
        try:
            pid = servers.gateway.pid
            asyncio.run(_store(servers.url, 2, 2))  # one turn of each kind: all processes up
            time.sleep(2.0)
            idle = tree_memory(pid)
            started = time.monotonic()
            failed = asyncio.run(_store(servers.url, turns, recall_every))
            stored_s = time.monotonic() - started
            deadline = time.monotonic() + settle
            last, still = -1, 0.0
            while True:
                stored, messages, vectors = _counts(Path(tmp))
                still = still + 1.0 if vectors == last else 0.0
                last = vectors
                written = stored >= turns + 2 - failed  # the writer caught up too
                if written and (not embeddings or vectors >= messages or still >= STALL_S):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            loaded = tree_memory(pid)
            result = {"config": {"turns": turns, "recall_every": recall_every,
                                 "embeddings": embeddings, "cpus": os.cpu_count(),
                                 "loadavg": round(os.getloadavg()[0], 2)},
                      "failed": failed, "stored_turns": stored, "messages": messages,
                      "embedded": vectors, "store_s": round(stored_s, 1),
                      "idle": idle, "after": loaded}
            servers.gateway.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                servers.gateway.wait(timeout=30)
        finally:
            servers.close()
    return result
