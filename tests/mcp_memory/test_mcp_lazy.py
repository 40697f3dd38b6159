"""The MCP SDK loads with the first /mcp request: a gateway nobody asks for MCP never
imports it (serving RSS, docs/benchmarks.md "Memory"), /mcp still answers, and
the gateway stops cleanly with its session manager running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, sys, urllib.request
from pathlib import Path
from lore_gateway.server import Gateway
from lore_gateway.testing import BackgroundServer, FakeUpstream
from lore_gateway.testing.gateway import gateway_settings

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "t", "version": "1"}}}

with BackgroundServer(FakeUpstream()) as fake:
    runner = BackgroundServer(Gateway(gateway_settings(fake, Path(sys.argv[1]))))
    gateway = runner.start()
    try:
        before = "mcp" in sys.modules
        with urllib.request.urlopen(gateway.url + "/health", timeout=60) as response:
            response.read()
        after_health = "mcp" in sys.modules
        request = urllib.request.Request(gateway.url + "/mcp", data=json.dumps(INITIALIZE).encode(),
            headers={"content-type": "application/json",
                     "accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
        print(before, after_health, answer["result"]["serverInfo"]["name"], "mcp" in sys.modules)
    finally:
        runner.stop()
    print("stopped")
"""


def test_the_sdk_loads_with_the_first_mcp_request(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "lore", "True", "stopped"]
