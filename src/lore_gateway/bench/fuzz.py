"""``lore bench fuzz``: the fuzz campaign of the test suite, with fresh random
cases and as many as asked for (``testing/fuzz.py`` holds the strategies and the
oracle). Needs the dev extra (hypothesis)."""

from __future__ import annotations

import contextlib
import time
from typing import Any


def run(*, client_cases: int, upstream_cases: int, seed: int | None = None) -> dict[str, Any]:
    from hypothesis import seed as hseed

    from lore_gateway.testing.fuzz import FuzzRig
    from lore_gateway.testing.fuzz import client_cases as clients
    from lore_gateway.testing.fuzz import upstream_cases as upstreams

    rig = FuzzRig()
    failures: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}
    try:
        for name, strategy, count, check in (
            ("client", clients(), client_cases, rig.check_client_case),
            ("upstream", upstreams(), upstream_cases, rig.check_upstream_case),
        ):
            if count <= 0:
                continue
            before = rig.tally.cases
            started = time.perf_counter()

            target = _campaign(strategy, count, check, name, failures)
            if seed is not None:
                target = hseed(seed)(target)
            # A failing case is recorded in ``failures`` (the shrunk one last);
            # hypothesis re-raises it, as an ExceptionGroup when it was flaky.
            with contextlib.suppress(AssertionError, ExceptionGroup):
                target()
            figures[name] = {"cases": rig.tally.cases - before,
                             "seconds": round(time.perf_counter() - started, 1)}
    finally:
        rig.close()
    return {"targets": figures, "aborted": rig.tally.aborted,
            "statuses": dict(sorted(rig.tally.by_status.items())),
            "failures": failures[-3:], "failed": bool(failures)}


def _campaign(strategy: Any, count: int, check: Any, name: str,
              failures: list[dict[str, Any]]) -> Any:
    """One hypothesis test over ``strategy``: ``check`` each case, record failures."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=count, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(strategy)
    def target(example: Any) -> None:
        problems = check(example)
        if problems:
            failures.append({"target": name, "case": repr(example)[:2000],
                             "problems": problems[:5]})
            raise AssertionError(problems)

    return target
