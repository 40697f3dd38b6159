"""A 50 MiB streamed answer passes through while the gateway stays small.

The gateway runs as ``lore serve`` (its own process, storage on) so its RSS can
be read from /proc without the test's own buffers mixed in. The client reads
and discards chunks as they arrive; a relay that buffered the stream, or
accumulated it for storage without a bound, would grow by the stream's size.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

MiB = 1024 * 1024
STREAM_MIB = 50
MAX_GROWTH_MIB = 20
# Direct from the fake, 50 MiB takes under a second; a relay doing linear work
# per chunk stays within a few seconds even on a busy 2-core machine. Past this,
# the relay is doing work that grows with what it has already sent.
MAX_SECONDS = 60


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_50_mib_stream_grows_gateway_rss_by_less_than_20_mib(
    lore_serve: tuple[str, subprocess.Popen[str], list[str], Path],
) -> None:
    url, process, _, _ = lore_serve
    body = {"model": "gpt-fake", "input": "stream a lot", "stream": True}
    with httpx.Client(timeout=120) as client:
        client.post(url + "/v1/responses", json=body)  # warm: imports, pools, storage
        baseline = rss_bytes(process.pid)
        peak = baseline
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_bytes(process.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        received, started = 0, time.monotonic()
        headers = {"x-fake-scenario": f"big-stream:{STREAM_MIB}"}
        try:
            with client.stream("POST", url + "/v1/responses", json=body,
                               headers=headers) as response:
                assert response.status_code == 200
                tail = b""
                for chunk in response.iter_raw():
                    received += len(chunk)
                    # The terminal event can straddle the last two chunks.
                    tail = (tail + chunk)[-65536:]
                    elapsed = time.monotonic() - started
                    if elapsed > MAX_SECONDS:
                        pytest.fail(f"only {received / MiB:.1f} MiB relayed in {elapsed:.0f} s; "
                                    f"gateway RSS grew {(peak - baseline) / MiB:.1f} MiB")
        finally:
            done.set()
            sampler.join()
    assert received >= STREAM_MIB * MiB
    assert b"response.completed" in tail
    growth = peak - baseline
    print(f"gateway RSS: baseline {baseline / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB, "
          f"growth {growth / MiB:.1f} MiB for {received / MiB:.1f} MiB streamed")
    assert growth < MAX_GROWTH_MIB * MiB
