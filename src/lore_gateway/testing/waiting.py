"""Waiting for what a gateway does after the client's response has ended.

Storage, distillation and curation finish off the request path, so a test that
checks them has nothing to await: it polls until the state it expects is there,
and fails with what it waited for. Deadlines are generous because the suite
shares two cores with the agent CLIs and Postgres; a passing wait returns as
soon as its condition holds, so they cost nothing when the machine is quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from lore_gateway.server import Gateway

T = TypeVar("T")

WAIT_S = 20.0
POLL_S = 0.02


def wait_until(check: Callable[[], T], what: str, timeout: float = WAIT_S) -> T:
    """Until ``check()`` is truthy; returns that value, or fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_S)
    return value


def wait_until_stored(gw: Gateway, text: str, *, tenant: str | None = None,
                      timeout: float = WAIT_S) -> None:
    """Until a message holding ``text`` is stored in ``gw``'s memory (a running
    ``BackgroundServer`` gateway), flushing its writer between looks."""
    memory = gw.memory
    if memory is None:
        raise AssertionError("this gateway stores no memory (LORE_STORE=false)")

    def stored() -> bool:
        memory.flush(timeout=10)
        return any(text in m.content for s in memory.sessions(tenant)
                   for m in memory.session_messages(tenant, s.session))

    wait_until(stored, f"{text!r} to be stored", timeout)
