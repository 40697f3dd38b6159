"""``lore bench fuzz``: the fuzz campaign of the test suite, with fresh random
cases and as many as asked for (``testing/fuzz.py`` holds the strategies and the
oracle). Needs the dev extra (hypothesis)."""

from __future__ import annotations

import contextlib
import time
from typing import Any


def run(*, client_cases: int, upstream_cases: int, seed: int | None = None) -> dict[str, Any]:
    from hypothesis import HealthCheck, given, settings
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

            @settings(max_examples=count, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
            @given(strategy)
            def target(example: Any, check: Any = check, name: str = name) -> None:
                problems = check(example)
                if problems:
                    failures.append({"target": name, "case": repr(example)[:2000],
                                     "problems": problems[:5]})
                    raise AssertionError(problems)

            if seed is not None:
                target = hseed(seed)(target)
            with contextlib.suppress(AssertionError):
                target()  # a failure is recorded above, the shrunk case last
            figures[name] = {"cases": rig.tally.cases - before,
                             "seconds": round(time.perf_counter() - started, 1)}
    finally:
        rig.close()
    return {"targets": figures, "aborted": rig.tally.aborted,
            "statuses": dict(sorted(rig.tally.by_status.items())),
            "failures": failures[-3:], "failed": bool(failures)}
