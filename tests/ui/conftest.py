"""Browser tests of /ui: Debian's chromium driven by Playwright, one browser per session.

The browser is Debian's ``chromium`` (``make test`` installs it when it runs as root
with apt; ``LORE_UI_BROWSER`` names another binary). Playwright never downloads a
browser here. Screenshots go to ``test-output/ui/`` in the repository (ignored by
git); the path is printed in the test log.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "test-output" / "ui"


def _browser_binary() -> str | None:
    named = os.environ.get("LORE_UI_BROWSER")
    if named:
        return named
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One browser per module, not per session: Playwright's sync API keeps its event
    loop running in the main thread while it is open, and pytest-asyncio cannot run
    an async test or fixture beside it; a test process (a pytest-xdist worker) runs
    other modules after these."""
    binary = _browser_binary()
    if binary is None:
        pytest.skip("the /ui browser tests need Debian's chromium: `apt-get install chromium` "
                    "(make test does it as root), or set LORE_UI_BROWSER")
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    print(f"\n/ui screenshots: {SHOTS}")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=binary,
                                      args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def shot() -> Callable[[Any, str], Path]:
    """``shot(page, name)`` writes ``test-output/ui/<name>.png`` (the whole page)."""
    def take(page: Any, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path
    return take


