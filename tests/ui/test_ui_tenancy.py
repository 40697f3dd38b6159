"""Team mode: the memory browser asks for a gateway key and shows only that key's tenant.

Key A's browser session must not see key B's sessions, search results, recalls or
knowledge, neither through the pages nor by typing B's URLs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from ui_kit import git_project, say, start_gateway, wait_turns

from lore_gateway.errors import GatewayError
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.tenancy import keys
from lore_gateway.testing import FakeUpstream

FACT_A = "Alice's build cache lives in /srv/cache-amber."
FACT_B = "Bob's secret project codename is heliotrope."


@pytest.fixture(scope="module")
def team(fake_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, Any]]:
    fake_server.reset()
    root = tmp_path_factory.mktemp("ui-team")
    project = git_project(root / "repo")
    runner = start_gateway(fake_server, root / "data", tenancy="keys")
    gw = runner.server
    (_, key_a) = gw.memory.write_job(lambda c: keys.create(c, "alice"))
    (_, key_b) = gw.memory.write_job(lambda c: keys.create(c, "bob"))
    _wait_for_keys(gw, key_a, key_b)
    say(gw, "alice-1", project, f"{FACT_A} Remember it.", key=key_a)
    say(gw, "bob-1", project, f"{FACT_B} Remember it.", key=key_b)
    wait_turns(gw, "alice-1", 1)
    wait_turns(gw, "bob-1", 1)
    entry_b, _ = gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant="bob", project=str(project), category="decision",
        title="Heliotrope launch", content="Launch heliotrope on Friday."))
    gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant="alice", project=str(project), category="pattern",
        title="Amber cache", content="The cache is amber."))
    bob_message = gw.memory.read(lambda c: c.execute(
        "SELECT id FROM messages WHERE tenant = 'bob' LIMIT 1").fetchone()[0])
    yield {"gw": gw, "url": gw.url, "key_a": key_a, "key_b": key_b, "entry_b": entry_b,
           "bob_message": bob_message}
    runner.stop()
    fake_server.reset()


def _wait_for_keys(gw: Any, *secrets: str) -> None:
    """Until the running gateway's key ring has re-read the keys table (about 1 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            for secret in secrets:
                gw.memory.tenancy.tenant({keys.KEY_HEADER: secret})
            return
        except GatewayError:
            time.sleep(0.05)
    raise AssertionError("the gateway never saw the new keys")


def _signed_in(browser: Any, url: str, key: str) -> Any:
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    response = page.goto(url + "/ui")
    assert page.url.endswith("/ui/sign-in") and response.status == 200
    page.locator("#key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Overview").wait_for()
    return page


def test_without_a_key_every_page_asks_for_one(team: dict[str, Any], browser: Any) -> None:
    context = browser.new_context()
    page = context.new_page()
    for path in ("/ui", "/ui/session?id=bob-1", "/ui/search?q=heliotrope", "/ui/knowledge",
                 "/ui/status", "/ui/events/overview"):
        page.goto(team["url"] + path)
        assert page.url.endswith("/ui/sign-in"), path
        assert "heliotrope" not in page.content()
    page.locator("#key").fill("lore_k_not-a-real-key")
    page.get_by_role("button", name="Sign in").click()
    assert "not a live gateway key" in page.locator("[role=alert]").inner_text()
    context.close()


def test_key_a_sees_only_its_own_memory(team: dict[str, Any], browser: Any, shot: Any) -> None:
    url = team["url"]
    page = _signed_in(browser, url, team["key_a"])
    assert team["key_a"] not in page.content()
    # The overview's charts are Alice's own traffic: one turn, not the gateway's two.
    page.wait_for_function("window.lore && window.lore.series")
    assert page.evaluate("window.lore.series.per_tenant") is True
    assert page.evaluate("window.lore.series.totals.requests") == 1
    assert page.locator('[data-total="requests"]').inner_text() == "1"
    page.goto(url + "/ui/sessions")
    listed = page.locator("main").inner_text()
    assert "alice-1" in listed and "bob-1" not in listed
    page.goto(url + "/ui/search?q=codename+heliotrope")
    assert page.locator("#results li.result").count() == 0
    assert "Nothing found" in page.locator("#results").inner_text()
    page.goto(url + "/ui/search?q=build+cache+amber")
    assert "/srv/cache-amber" in page.locator("#results").inner_text()
    page.goto(url + "/ui/knowledge")
    assert "Amber cache" in page.locator("main").inner_text()
    assert "Heliotrope" not in page.locator("main").inner_text()
    shot(page, "team-alice-knowledge")
    # Bob's things by direct URL: not found, never shown.
    for path in ("/ui/session?id=bob-1", f"/ui/knowledge/edit?id={team['entry_b'].id}",
                 f"/ui/message?id={team['bob_message']}", "/ui/session?id=bob-1&part=turns"):
        response = page.goto(url + path)
        assert response.status == 404, path
        assert "heliotrope" not in page.content().lower(), path
    # Nor can Alice's own form delete Bob's entry.
    page.goto(url + "/ui/knowledge")
    csrf = page.locator("input[name=csrf]").first.get_attribute("value") or ""
    page.request.post(url + "/ui/knowledge/delete",
                      form={"csrf": csrf, "id": team["entry_b"].id})
    still = team["gw"].memory.read(lambda c: kstore.entries(c, "bob", None))
    assert [e.title for e in still] == ["Heliotrope launch"]
    # The status page leaves out paths and every tenant's totals.
    page.goto(url + "/ui/status")
    assert str(team["gw"].settings.data_dir) not in page.content()
    page.context.close()


def test_key_b_sees_its_own_and_not_alices(team: dict[str, Any], browser: Any) -> None:
    page = _signed_in(browser, team["url"], team["key_b"])
    page.goto(team["url"] + "/ui/search?q=codename+heliotrope")
    assert "heliotrope" in page.locator("#results").inner_text()
    page.goto(team["url"] + "/ui/search?q=build+cache+amber")
    assert "/srv/cache-amber" not in page.locator("#results").inner_text()
    response = page.goto(team["url"] + "/ui/session?id=alice-1")
    assert response.status == 404
    page.context.close()
