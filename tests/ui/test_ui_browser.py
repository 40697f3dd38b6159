"""The memory browser in a real headless Chromium, in front of a gateway with traffic.

One gateway (personal mode, loopback) for the module: turns go through it from the
openai SDK to the fake upstream, one of them with a hidden recall; a knowledge
entry is stored for the project, a git work tree so ``.lore.md`` is written.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect
from ui_kit import FACT, RECALL_QUERY, git_project, say, start_gateway, wait_turns

from lore_gateway.distill import store as dstore
from lore_gateway.knowledge import history
from lore_gateway.knowledge import store as kstore
from lore_gateway.memory.tenancy.identity import PERSONAL
from lore_gateway.testing import FakeUpstream

SESSION = "ui-session-1"
RECALL_SESSION = "ui-session-recall"


@pytest.fixture(scope="module")
def site(fake_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, Any]]:
    fake_server.reset()
    root = tmp_path_factory.mktemp("ui")
    project = git_project(root / "repo")
    runner = start_gateway(fake_server, root / "data")
    gw = runner.server
    say(gw, SESSION, project, f"{FACT} Remember it.")
    say(gw, SESSION, project, "Also: the deploy branch is release/blue.")
    wait_turns(gw, SESSION, 2)
    sources = gw.memory.read(lambda c: [dstore.SourceMessage(int(i), str(r), str(t), float(w))
                                        for i, r, t, w in c.execute(
        "SELECT id, role, content, created_at FROM messages WHERE session = ? ORDER BY id",
        (SESSION,))])
    made = gw.memory.write_job(lambda c: dstore.save(
        c, tenant=PERSONAL, project=str(project), session=SESSION, generation=0,
        text="Rotation Tue 04:00 UTC.", sources=sources, method="extractive"))
    assert made is not None, "the distillation was not stored"
    answer = say(gw, RECALL_SESSION, project, "When does the password rotate?",
                 scenario=f"recall:{RECALL_QUERY}")
    assert "According to memory" in answer
    wait_turns(gw, RECALL_SESSION, 1)
    entry, _ = gw.memory.write_job(lambda c: kstore.upsert(
        c, tenant=PERSONAL, project=str(project), category="decision",
        title="Deploy branch", content="Deploys go out from release/blue."))
    yield {"gw": gw, "url": gw.url, "project": project, "entry": entry}
    runner.stop()
    fake_server.reset()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # bypass_csp: the page forbids eval, which Playwright's wait_for_function uses.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield tab
    context.close()
    assert not errors, f"the page logged errors: {errors}"


PAGES = [("/ui", "Overview"), ("/ui/projects", "Projects"), ("/ui/sessions", "Every session"),
         (f"/ui/session?id={SESSION}", "Session"), ("/ui/search", "Search"),
         ("/ui/recalls", "Recall log"), ("/ui/knowledge", "Knowledge"), ("/ui/status", "Status"),
         ("/ui/knowledge/edit", "New knowledge entry")]


def test_every_page_opens_with_its_heading(site: dict[str, Any], page: Any, shot: Any) -> None:
    for path, heading in PAGES:
        response = page.goto(site["url"] + path)
        assert response.status == 200, path
        assert page.locator("h1").inner_text().startswith(heading), path
        assert page.locator("main").inner_text().strip()
        name = path.strip("/").replace("/", "-").split("?")[0] or "ui"
        shot(page, f"page-{name}")
    # The session page shows both turns, and the project links to its sessions.
    page.goto(site["url"] + "/ui/projects")
    page.get_by_role("link", name=str(site["project"])).first.click()
    page.get_by_role("link", name=re.compile("ui-session-1")).click()
    assert "04:00 UTC" in page.locator("#turns").inner_text()
    assert page.locator("article.turn .msg.user").count() == 2
    # The distillation sits beside the turns it covers.
    aside = page.locator("article.turn aside.distill")
    assert aside.count() == 1 and "t:1" in aside.inner_text()
    shot(page, "session-with-distillation")


def test_search_finds_the_stored_fact_with_score_and_match(site: dict[str, Any],
                                                           page: Any, shot: Any) -> None:
    page.goto(site["url"] + "/ui/search")
    page.keyboard.type("password rotation Tuesday")
    first = page.locator("#results li.result").first
    first.wait_for()
    assert "04:00 UTC" in first.inner_text()
    assert "matched in the message" in first.inner_text()
    assert first.locator("mark").count() >= 2
    score = float(first.locator(".score").inner_text())
    assert 0 < score <= 1
    shot(page, "search-results")
    # Without JavaScript the same search is a plain GET form.
    page.goto(site["url"] + "/ui/search?q=release%2Fblue")
    assert "release/blue" in page.locator("#results").inner_text()


def test_the_recall_log_shows_the_query_results_and_answer(site: dict[str, Any], page: Any,
                                                           shot: Any) -> None:
    page.goto(site["url"] + "/ui/recalls")
    page.get_by_role("link", name=RECALL_QUERY).click()
    assert RECALL_QUERY in page.locator("#recall-query").inner_text()
    results = page.locator("#recall-results").inner_text()
    assert "04:00 UTC" in results and "t:" in results
    assert "According to memory" in page.locator("#recall-answer").inner_text()
    shot(page, "recall-detail")
    # The round trip is marked in its session, beside the answer it fed.
    page.get_by_role("link", name=RECALL_SESSION).click()
    trip = page.locator(".recall-trip")
    assert RECALL_QUERY in trip.first.inner_text()
    # Tool calls are collapsed until asked for, by click or keyboard.
    call = page.locator("details.msg.tool_call").first
    assert call.get_attribute("open") is None
    call.locator("summary").focus()
    page.keyboard.press("Enter")
    assert call.get_attribute("open") is not None and RECALL_QUERY in call.inner_text()


def test_editing_knowledge_rewrites_lore_md(site: dict[str, Any], page: Any, shot: Any) -> None:
    page.goto(site["url"] + "/ui/knowledge")
    page.get_by_role("link", name="Edit Deploy branch").click()
    page.locator("#content").fill("Deploys go out from release/green since the freeze.")
    page.get_by_role("button", name="Save").click()
    page.locator(".just-saved").wait_for()
    assert "release/green" in page.locator(".just-saved").inner_text()
    lore_md = (site["project"] / ".lore.md").read_text()
    assert "release/green since the freeze" in lore_md and "release/blue" not in lore_md
    shot(page, "knowledge-after-edit")
    # A new entry, then its deletion: the file follows both.
    page.get_by_role("link", name="New entry").click()
    page.locator("#title").fill("Test runner")
    page.locator("#content").fill("Run the suite with make test.")
    page.get_by_role("button", name="Save").click()
    assert "make test" in (site["project"] / ".lore.md").read_text()
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete Test runner").click()
    page.get_by_role("heading", name="Knowledge").wait_for()
    assert "make test" not in (site["project"] / ".lore.md").read_text()
    assert "Test runner" not in page.locator("main").inner_text()


def test_an_entrys_page_shows_its_history_with_each_diff(site: dict[str, Any], page: Any,
                                                         shot: Any) -> None:
    memory, project = site["gw"].memory, str(site["project"])
    entry, _ = memory.write_job(lambda c: kstore.upsert(
        c, tenant=PERSONAL, project=project, category="gotcha", title="Cache TTL",
        content="The cache TTL is 30 s."))
    memory.write_job(lambda c: kstore.upsert(
        c, tenant=PERSONAL, project=project, category="gotcha", title="Cache TTL",
        content="The cache TTL is 300 s.", entry_id=entry.id, actor=history.USER))
    page.goto(site["url"] + "/ui/knowledge")
    page.get_by_role("link", name="Edit Cache TTL").click()
    versions = page.locator("#entry-history li.version")
    assert versions.count() == 2
    newest, first = versions.nth(0), versions.nth(1)
    assert newest.inner_text().startswith("v2 updated by user")
    assert newest.locator(".del").all_inner_texts() == ["-The cache TTL is 30 s."]
    assert newest.locator(".add").all_inner_texts() == ["+The cache TTL is 300 s."]
    assert first.inner_text().startswith("v1 created by curator")
    assert "+The cache TTL is 30 s." in first.locator(".add").all_inner_texts()
    shot(page, "knowledge-history")


def _total(page: Any, key: str) -> int:
    return int(page.locator(f'[data-total="{key}"]').inner_text().replace(",", "") or 0)


def test_overview_charts_show_the_traffic_and_update_live(site: dict[str, Any], page: Any,
                                                         shot: Any) -> None:
    page.goto(site["url"] + "/ui?window=15m")
    page.wait_for_function("window.lore && window.lore.series && "
                           "window.lore.series.totals.requests >= 3")
    drawn = page.evaluate("""() => Object.fromEntries(
        Object.entries(window.lore.charts).map(([k, v]) => [k, v.chart.data.slice(1).flat()
            .filter(x => x).reduce((a, b) => a + b, 0)]))""")
    assert drawn["requests"] >= 3 and drawn["tokens"] > 0 and drawn["recall_calls"] >= 1
    assert drawn["recall_hit_rate"] > 0 and drawn["overhead_ms"] > 0
    assert page.locator(".plot canvas").count() == 6
    before = _total(page, "requests")
    say(site["gw"], "ui-session-live", site["project"], "One more request for the chart.")
    page.wait_for_function(f"Number(document.querySelector('[data-total=\"requests\"]')"
                           f".textContent.replace(/,/g, '')) > {before}")
    shot(page, "overview")


def test_the_session_view_shows_a_new_turn_without_reload(site: dict[str, Any],
                                                         page: Any) -> None:
    page.goto(site["url"] + f"/ui/session?id={SESSION}")
    page.evaluate("window.__marker = 'same page'")
    page.wait_for_function("document.querySelector('[data-live]')"
                           ".getAttribute('data-version') !== null")
    say(site["gw"], SESSION, site["project"], "A live turn: the cache key is blake3.")
    page.get_by_text("the cache key is blake3").wait_for()
    assert page.evaluate("window.__marker") == "same page"
    # j / k walk the turns from the keyboard.
    page.locator("h1").click()
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert page.evaluate("document.activeElement.id") == page.locator("article.turn").nth(1) \
        .get_attribute("id")
    page.keyboard.press("k")
    assert page.evaluate("document.activeElement.id") == page.locator("article.turn").nth(0) \
        .get_attribute("id")


def test_phone_width_dark_theme_and_keyboard(site: dict[str, Any], browser: Any,
                                            shot: Any) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  color_scheme="dark", bypass_csp=True)
    phone = context.new_page()
    phone.goto(site["url"] + f"/ui/session?id={RECALL_SESSION}")
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "the page scrolls sideways at phone width"
    background = phone.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 22, 26)"
    shot(phone, "phone-dark-session")
    phone.goto(site["url"] + "/ui")
    shot(phone, "phone-dark-overview")
    # Keyboard: the skip link comes first, "/" opens search, the theme toggles.
    phone.keyboard.press("Tab")
    assert phone.evaluate("document.activeElement.textContent") == "Skip to content"
    phone.keyboard.press("Escape")
    phone.locator("body").click(position={"x": 5, "y": 300})
    phone.keyboard.press("/")
    phone.wait_for_url(re.compile(r"/ui/search$"))
    # The field's autofocus lands at a rendering step after the page's load event:
    # an assertion that waits for it (CI once read the focus before it landed).
    expect(phone.locator("#q")).to_be_focused()
    phone.locator("#theme").click()
    assert phone.evaluate("document.documentElement.dataset.theme") == "light"
    context.close()


def test_the_browser_never_sees_a_credential(site: dict[str, Any], page: Any) -> None:
    for path, _ in PAGES:
        page.goto(site["url"] + path)
        assert "sk-ui-test" not in page.content(), path
