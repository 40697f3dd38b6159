"""Amnesia from /ui in a real headless Chromium (issue 36): switched on for every
session on the Status page and for one session on its page, switched off again;
the turns in between are forwarded (the agent gets its answer) and not stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_kit import git_project, say, start_gateway, wait_turns

from lore_gateway.memory.data import amnesia
from lore_gateway.testing import FakeUpstream, wait_until

SESSION = "ui-amnesia"


@pytest.fixture
def gateway(fake_upstream: FakeUpstream, tmp_path: Path) -> Iterator[Any]:
    runner = start_gateway(fake_upstream, tmp_path / "data")
    yield runner.server
    runner.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    context.close()
    assert not errors, f"the page logged errors: {errors}"


def stored_turns(gw: Any, session: str) -> int:
    wait_until(lambda: gw.proxy.active == 0, "the gateway to end its responses")
    gw.memory.flush(timeout=10)
    return int(gw.memory.count_turns(None, session=session))


def test_amnesia_switched_from_the_status_and_session_pages(
        gateway: Any, page: Any, shot: Any, tmp_path: Path) -> None:
    gw = gateway
    project = git_project(tmp_path / "repo")
    say(gw, SESSION, project, "The build cache lives in /var/cache/lore-build.")
    wait_turns(gw, SESSION, 1)

    # Every session, from the Status page.
    page.goto(gw.url + "/ui/status")
    page.get_by_role("button", name="Turn amnesia on").click()
    page.get_by_role("button", name="Turn amnesia off").wait_for()
    assert "Nothing of any session is kept" in page.locator("section.amnesia").inner_text()
    rows = gw.memory.read(amnesia.entries)
    assert [(a.scope, a.by) for a in rows] == [("all", "ui")]
    shot(page, "amnesia-on")
    assert say(gw, SESSION, project, "Where does the build cache live?")  # answered
    assert stored_turns(gw, SESSION) == 1
    page.goto(gw.url + f"/ui/session?id={SESSION}")
    assert "amnesia is on for every session" in page.locator("form.amnesia").inner_text()
    page.goto(gw.url + "/ui/status")
    page.get_by_role("button", name="Turn amnesia off").click()
    page.get_by_role("button", name="Turn amnesia on").wait_for()
    say(gw, SESSION, project, "Stored again: the deploy window is Thursday.")
    wait_turns(gw, SESSION, 2)

    # One session, from its page.
    page.goto(gw.url + f"/ui/session?id={SESSION}")
    page.get_by_role("button", name="Keep this session out of memory").click()
    page.get_by_role("button", name="Store this session again").wait_for()
    assert gw.amnesia.active("personal", SESSION) is not None
    assert gw.amnesia.active("personal", "another-session") is None
    shot(page, "amnesia-session")
    say(gw, SESSION, project, "Not kept: the staging password hint is heron.")
    say(gw, "another-session", project, "Kept: the linter runs before every commit.")
    wait_turns(gw, "another-session", 1)
    assert stored_turns(gw, SESSION) == 2
    page.get_by_role("button", name="Store this session again").click()
    page.get_by_role("button", name="Keep this session out of memory").wait_for()
    assert gw.memory.read(amnesia.entries) == []
