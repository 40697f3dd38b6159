"""The memory browser's pages load on first use: a gateway whose /ui nobody opens
never imports jinja2 (serving RSS, issue 14), and /ui still answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, urllib.request
from pathlib import Path
from lore_gateway.server import Gateway
from lore_gateway.testing import BackgroundServer, FakeUpstream
from lore_gateway.testing.gateway import gateway_settings

with BackgroundServer(FakeUpstream()) as fake:
    runner = BackgroundServer(Gateway(gateway_settings(fake, Path(sys.argv[1]))))
    gateway = runner.start()
    try:
        before = "jinja2" in sys.modules
        with urllib.request.urlopen(gateway.url + "/ui", timeout=60) as response:
            page = response.read().decode()
            print(before, response.status, "<html" in page.lower(), "jinja2" in sys.modules)
    finally:
        runner.stop()
"""


def test_ui_pages_load_when_first_opened(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "200", "True", "True"]


SERVE = """
import os, socket, sys, threading, time
from lore_gateway.cli.run import probe_health

def watch(port):
    deadline = time.monotonic() + 120
    while probe_health(f"http://127.0.0.1:{port}", timeout=1) is None:
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.05)
    print(*sorted(m for m in ("rich", "jinja2", "pygments", "lore_gateway.cli.output")
                  if m in sys.modules), "serving")
    sys.stdout.flush()
    os._exit(0)

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
os.environ["LORE_PORT"] = str(port)
threading.Thread(target=watch, args=(port,), daemon=True).start()
sys.argv = ["lore", "serve"]
from lore_gateway.cli.main import main
main()
"""


def test_lore_serve_holds_neither_rich_nor_the_ui_templates(tmp_path: Path) -> None:
    """`lore serve`'s process registers only its command and logs through structlog
    without rich: the other commands' imports stay out of the gateway's RSS."""
    env = {**os.environ, "LORE_DATA_DIR": str(tmp_path), "LORE_EMBEDDINGS": "false",
           "LORE_STORE": "false", "LORE_WORKER": "false"}
    out = subprocess.run([sys.executable, "-c", SERVE], capture_output=True, text=True,
                         timeout=180, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["lore_gateway.cli.output", "serving"]
