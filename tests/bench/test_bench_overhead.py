"""``lore bench overhead``: the relay floor is a true passthrough, and one small run
carries every figure the issue asks for (the figures themselves are not asserted:
they are measurements)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from lore_gateway.bench import big_session, overhead


def _post(url: str, work: overhead.Workload) -> tuple[int, bytes]:
    request = urllib.request.Request(url + work.path, data=work.body, headers=work.headers)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.status, resp.read()


def test_relay_forwards_the_upstream_bytes_untouched(tmp_path: Path) -> None:
    with overhead.running_servers(events=41, store=False, data_dir=tmp_path) as servers:
        for protocol in overhead.PROTOCOLS:
            work = overhead.workload(protocol, tool=True)
            direct = _post(servers.urls["direct"], work)
            relayed = _post(servers.urls["relay"], work)
            assert relayed == direct
            assert b"tok1" in relayed[1]


def test_one_run_reports_every_target_and_the_gateway_against_the_relay() -> None:
    result = overhead.run(requests_c1=4, requests_c16=16, protocols=("responses", "chat"),
                          shapes=("tool",), big_mb=0)
    for phase in ("c1", "c16"):
        for name in ("responses/tool", "chat/tool"):
            figures = result[phase][name]
            for target in overhead.TARGETS:
                assert figures[target]["errors"] == 0
                assert figures[target]["requests"] == (4 if phase == "c1" else 16)
            assert set(figures["gateway_vs_relay"]) >= {
                "added_p50_diff_ms", "added_p99_diff_ms", "rps_ratio", "cpu_ratio"}
            gateway = figures["gateway"]
            assert gateway["cpu_ms_per_request"] >= 0
            # The tree's CPU, split by process: the gateway itself and its named children.
            by_process = gateway["cpu_ms_per_request_by_process"]
            assert {"main", "lore-store", "lore-embed"} <= set(by_process)
            assert by_process["main"] == gateway["cpu_ms_per_request_main"]
            assert sum(by_process.values()) == pytest.approx(gateway["cpu_ms_per_request"])
    memory = result["memory"]
    assert memory["relay"]["peak_rss_mb"] > 0
    assert memory["gateway"]["tree_peak_rss_mb"] >= memory["gateway"]["peak_rss_mb"] > 0
    assert [c["check"].split(":")[0] for c in result["targets"]] == [
        "c=1 responses/tool", "c=16 responses/tool", "c=1 chat/tool", "c=16 chat/tool"]


def test_gemini_has_the_same_targets_as_the_other_protocols() -> None:
    result = overhead.run(requests_c1=4, requests_c16=16, protocols=("gemini",),
                          shapes=("tool",), big_mb=0)
    for phase in ("c1", "c16"):
        figures = result[phase]["gemini/tool"]
        assert all(figures[target]["errors"] == 0 for target in overhead.TARGETS)
        assert "added_p50_diff_ms" in figures["gateway_vs_relay"]
    assert [(c["check"].split(":")[0], c["limit"]) for c in result["targets"]] == [
        ("c=1 gemini/tool", "<= 0.5"), ("c=16 gemini/tool", f">= {overhead.MIN_RPS_RATIO_C16}")]


def test_big_session_runs_the_whole_request_pipeline() -> None:
    result = big_session.run(tokens=20_000, runs=1)
    assert result["anchor_expanded"] and result["recall_injected"]
    assert result["items"] > 100
    assert result["prepare_p50_ms"] > 0 and result["loop_block_max_ms"] >= 0
    assert set(result["steps"]) >= {"decode zstd", "parse and check JSON",
                                    "pipeline (anchors, context, knowledge, tool)"}


def test_watched_stream_compares_the_two_paths() -> None:
    result = overhead.run_watched(megabytes=0.05, delta_bytes=256, repeats=1)
    assert result["plain_s"] > 0 and result["watched_s"] > 0
