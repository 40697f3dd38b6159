"""Worker job leases: gateways sharing one database run each job once.

Each "instance" here is its own connection to one database file, as two
``lore serve`` processes would hold (the two-instance test drives real ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from lore_gateway.storage import db, schema
from lore_gateway.worker import jobs

NOW = 1_000_000.0
LEASE = 30.0


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[apsw.Connection, apsw.Connection]]:
    path = tmp_path / "lore.db"
    a = db.connect(path)
    schema.migrate(a)
    b = db.connect(path)
    yield a, b
    a.close()
    b.close()


def test_a_due_job_is_claimed_by_one_instance_only(two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    assert jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW)
    job = jobs.claim(a, "A", NOW, LEASE)
    assert job is not None and job.session == "s1"
    assert jobs.claim(b, "B", NOW, LEASE) is None
    assert jobs.claim(a, "A", NOW, LEASE) is None  # not twice by its holder either
    assert jobs.counts(b)["running"] == 1
    assert jobs.finish(a, job.id, "done", NOW + 1, instance="A")
    assert jobs.claim(b, "B", NOW + 2, LEASE) is None
    assert jobs.counts(b) == {"queued": 0, "done": 1, "failed": 0, "running": 0}


def test_two_instances_take_different_jobs(two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    for session in ("s1", "s2"):
        jobs.enqueue(a, "distill", "personal", "/p", session, NOW)
    first, second = jobs.claim(a, "A", NOW, LEASE), jobs.claim(b, "B", NOW, LEASE)
    assert first is not None and second is not None
    assert {first.session, second.session} == {"s1", "s2"}


def test_an_owned_job_waits_for_its_owner_until_it_is_orphaned(
        two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW, owner="A")
    assert jobs.claim(b, "B", NOW, LEASE) is None
    assert jobs.claim(b, "B", NOW + jobs.ORPHAN_AFTER_S - 1, LEASE) is None
    orphan = jobs.claim(b, "B", NOW + jobs.ORPHAN_AFTER_S, LEASE)
    assert orphan is not None and orphan.session == "s1"


def test_the_instance_that_saw_the_session_last_adopts_its_queued_job(
        two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW, owner="A")
    assert not jobs.enqueue(b, "distill", "personal", "/p", "s1", NOW, owner="B")
    assert jobs.claim(a, "A", NOW, LEASE) is None
    assert jobs.claim(b, "B", NOW, LEASE) is not None


def test_a_lease_that_ran_out_passes_the_job_on_and_its_result_is_not_saved(
        two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW)
    job = jobs.claim(a, "A", NOW, LEASE)
    assert job is not None
    assert jobs.holds(a, job.id, "A", NOW + LEASE - 1)
    assert jobs.renew(a, job.id, "A", NOW + 2 * LEASE)
    assert jobs.claim(b, "B", NOW + LEASE + 1, LEASE) is None  # renewed: still A's
    again = jobs.claim(b, "B", NOW + 2 * LEASE + 1, LEASE)
    assert again is not None and again.id == job.id
    # A comes back late: it no longer holds the job, so it saves and ends nothing.
    assert not jobs.holds(a, job.id, "A", NOW + 2 * LEASE + 2)
    assert not jobs.renew(a, job.id, "A", NOW + 3 * LEASE)
    assert not jobs.finish(a, job.id, "done", NOW + 2 * LEASE + 2, instance="A")
    assert jobs.finish(b, job.id, "done", NOW + 2 * LEASE + 3, instance="B")


def test_a_stopping_instance_releases_its_leases(two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW)
    assert jobs.claim(a, "A", NOW, LEASE) is not None
    assert jobs.release(a, "A") == 1
    assert jobs.claim(b, "B", NOW + 1, LEASE) is not None


def test_a_retry_releases_the_lease_until_the_job_is_due_again(
        two: tuple[apsw.Connection, ...]) -> None:
    a, b = two
    jobs.enqueue(a, "distill", "personal", "/p", "s1", NOW)
    job = jobs.claim(a, "A", NOW, LEASE)
    assert job is not None
    jobs.retry(a, job.id, NOW + 5, NOW, "retry: upstream busy", instance="A")
    assert jobs.claim(b, "B", NOW + 4, LEASE) is None
    again = jobs.claim(b, "B", NOW + 5, LEASE)
    assert again is not None and again.attempts == 1
