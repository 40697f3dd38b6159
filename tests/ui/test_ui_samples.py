"""The overview's metrics survive a restart, and the pages need no browser to be right."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ui_kit import git_project, say, start_gateway, wait_turns

from lore_gateway.testing import FakeUpstream


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _series(gw: Any) -> dict[str, Any]:
    status, _, body = _get(gw.url + "/ui/series?window=15m")
    assert status == 200
    data: dict[str, Any] = json.loads(body)
    return data


def test_the_charts_keep_their_samples_across_a_restart(fake_upstream: FakeUpstream,
                                                        tmp_path: Path) -> None:
    project = git_project(tmp_path / "repo")
    first = start_gateway(fake_upstream, tmp_path / "data")
    for i in range(3):
        say(first.server, "restart-1", project, f"request {i}")
    wait_turns(first.server, "restart-1", 3)
    first.stop()  # stopping stores the last sample
    second = start_gateway(fake_upstream, tmp_path / "data")
    try:
        totals = _series(second.server)["totals"]
        assert totals["requests"] >= 3
        assert totals["tokens_in"] > 0 and totals["tokens_out"] > 0
    finally:
        second.stop()


@pytest.mark.parametrize("path", ["/ui", "/ui/search?q=x", "/ui/status"])
def test_pages_are_html_with_a_strict_content_policy(fake_upstream: FakeUpstream,
                                                     tmp_path: Path, path: str) -> None:
    runner = start_gateway(fake_upstream, tmp_path / "data")
    try:
        status, headers, body = _get(runner.server.url + path)
        assert status == 200 and body.startswith(b"<!doctype html>")
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["cache-control"] == "no-store"
        status, _, _ = _get(runner.server.url + "/ui/static/htmx.min.js")
        assert status == 200
        # An encoded separator is refused before routing (docs/reliability.md).
        status, _, _ = _get(runner.server.url + "/ui/static/..%2Fapp.py")
        assert status == 400
        status, _, _ = _get(runner.server.url + "/ui/static/app.py")
        assert status == 404
    finally:
        runner.stop()


def test_an_open_live_stream_does_not_hold_the_shutdown(fake_upstream: FakeUpstream,
                                                        tmp_path: Path) -> None:
    import http.client
    import threading

    runner = start_gateway(fake_upstream, tmp_path / "data")
    gw = runner.server
    connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    connection.request("GET", "/ui/events/overview")
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("content-type", "").startswith(
        "text/event-stream")
    assert response.readline().startswith(b"retry:")
    stopper = threading.Thread(target=runner.stop)
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "the gateway waited for the open event stream"
    connection.close()


def test_with_storage_off_the_pages_say_so_and_status_still_works(
        fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    runner = start_gateway(fake_upstream, tmp_path / "data", store=False)
    try:
        status, _, body = _get(runner.server.url + "/ui/search?q=anything")
        assert status == 200 and b"Memory is off" in body
        status, _, body = _get(runner.server.url + "/ui/status")
        assert status == 200 and b"<h1>Status</h1>" in body
        status, _, _ = _get(runner.server.url + "/ui/events/overview")
        assert status == 404
    finally:
        runner.stop()
