"""The fuzz campaign in CI (issue 10 point 10): request bodies and headers on every
route, and malformed upstream streams from a fuzzing fake (``testing/fuzz.py``).

Derandomized, so CI runs the same cases every time; ``lore bench fuzz`` runs as
many fresh ones as asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from lore_gateway.testing.fuzz import (
    ClientCase,
    FuzzRig,
    UpstreamCase,
    client_cases,
    upstream_cases,
)

# Cases per target; together over the 10k of the acceptance (LORE_FUZZ_SCALE scales).
SCALE = float(os.environ.get("LORE_FUZZ_SCALE", "1"))
CLIENT_CASES = int(6000 * SCALE)
UPSTREAM_CASES = int(4500 * SCALE)



def ci(examples: int) -> settings:
    return settings(derandomize=True, database=None, deadline=None, print_blob=True,
                    max_examples=examples, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def rig() -> Iterator[FuzzRig]:
    rig = FuzzRig()
    yield rig
    rig.close()


def test_client_requests_on_every_route(rig: FuzzRig) -> None:
    @ci(CLIENT_CASES)
    @given(client_cases())
    def case(example: ClientCase) -> None:
        problems = rig.check_client_case(example)
        assert not problems, problems

    case()
    assert rig.tally.cases >= CLIENT_CASES


def test_malformed_upstream_streams(rig: FuzzRig) -> None:
    start = rig.tally.cases

    @ci(UPSTREAM_CASES)
    @given(upstream_cases())
    def case(example: UpstreamCase) -> None:
        problems = rig.check_upstream_case(example)
        assert not problems, problems

    case()
    assert rig.tally.cases - start >= UPSTREAM_CASES
