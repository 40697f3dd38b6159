"""Recall follow-ups on a managed context stay inside the window (issue 31):
through the real gateway to the metered, strict fake upstream.

A follow-up is the planned context plus the recall pairs, so a chain of long
recall results can outgrow what was planned; before the fix nothing checked,
and a refused follow-up reached the client as "could not continue".
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lore_gateway.testing import FakeUpstream
from lore_gateway.testing.fake_metered import BYTES_PER_TOKEN

from .test_context_e2e import WINDOW, AnthropicAgent, agent_requests, extends, rewrites

CEILING = 0.8  # of the window: the follow-up ceiling at the default budget share


@pytest.fixture
def metered(fake_upstream: FakeUpstream) -> FakeUpstream:
    fake_upstream.metered = True
    return fake_upstream


def managed_agent(gw: Any, session: str, fake: FakeUpstream, *, until: int) -> AnthropicAgent:
    """An agent whose context is managed and whose last request is at least
    ``until`` tokens."""
    agent = AnthropicAgent(gw, session)
    agent.first_turn()
    while True:
        agent.tool_round()
        assert agent.send()[0] == 200
        last = agent_requests(fake)[-1]
        managed = b"lore-gateway: session history" in last.body
        if managed and len(last.body) // BYTES_PER_TOKEN >= until:
            return agent


def tokens(request: Any) -> int:
    return len(request.body) // BYTES_PER_TOKEN


def test_a_chain_of_long_recalls_is_replanned_to_fit_the_window(
        make_gateway: Any, metered: FakeUpstream) -> None:
    metered.window = WINDOW
    gw = make_gateway(context_window=WINDOW)
    agent = managed_agent(gw, "fit-chain", metered, until=int(0.6 * WINDOW))
    gw.memory.flush(10)
    start = len(agent_requests(metered))
    before = rewrites(gw)
    # Two recalls in one answer, each result up to 12,000 characters (~3,000
    # tokens): the first follow-up would already pass the ceiling.
    metered.script(["call-recall:handler request", "call-recall:grep src module",
                    "recall:def handler"])
    agent.messages.append({"role": "assistant", "content": [{"type": "text", "text": "Ok."}]})
    agent.messages.append({"role": "user", "content": [
        {"type": "text", "text": "Which handlers did we find in module 3?"}]})
    status, raw = agent.send(stream=False)
    assert status == 200, raw
    chain = agent_requests(metered)[start:]
    assert len(chain) == 3  # the principal and two follow-ups
    assert all(tokens(r) <= CEILING * WINDOW for r in chain), [tokens(r) for r in chain]
    assert list(metered.refusals) == []
    # The chain was re-planned (room made for the pairs) rather than sent over
    # the ceiling, and each follow-up after that extends the one before.
    assert rewrites(gw).get("budget", 0) > before.get("budget", 0)
    last_two = [r.json["messages"] for r in chain[-2:]]
    assert extends(last_two[0], last_two[1])
    assert b"According to memory" in raw


def test_a_follow_up_the_provider_refuses_is_retried_once_at_a_higher_layer(
        make_gateway: Any, metered: FakeUpstream) -> None:
    gw = make_gateway(context_window=WINDOW)
    agent = managed_agent(gw, "fit-refused", metered, until=int(0.45 * WINDOW))
    gw.memory.flush(10)
    base = tokens(agent_requests(metered)[-1])
    # The provider's window turns out smaller than the gateway believed: the
    # request fits, its follow-up with a long recall result does not.
    metered.window = base + 1_500
    start = len(agent_requests(metered))
    before = rewrites(gw)
    agent.messages.append({"role": "assistant", "content": [{"type": "text", "text": "Ok."}]})
    agent.messages.append({"role": "user", "content": [
        {"type": "text", "text": "Which handlers did we find in module 3?"}]})
    status, raw = agent.send("recall:handler request grep src module", stream=False)
    assert status == 200, raw
    chain = agent_requests(metered)[start:]
    assert len(chain) == 3, [tokens(r) for r in chain]
    principal, refused, retried = chain
    assert tokens(refused) > metered.window >= tokens(retried)
    assert tokens(retried) < tokens(refused)
    assert rewrites(gw).get("overflow", 0) == before.get("overflow", 0) + 1
    assert b"According to memory" in raw
    # The next turn renders the re-planned context: no second refusal.
    agent.messages.append({"role": "assistant", "content": orjson.loads(raw)["content"]})
    agent.messages.append({"role": "user", "content": [{"type": "text", "text": "Thanks."}]})
    assert agent.send()[0] == 200
    assert tokens(agent_requests(metered)[-1]) <= metered.window
    # The retry is a smaller context, not the principal's plus the pair.
    assert not extends(principal.json["messages"], retried.json["messages"])


def test_expanded_recall_pairs_count_towards_the_window(
        make_gateway: Any, metered: FakeUpstream) -> None:
    """The client's body lacks the recall pairs its anchors expand into; each
    recall adds ~3,000 tokens upstream that the client never sent."""
    metered.window = WINDOW
    gw = make_gateway(context_window=WINDOW)
    agent = managed_agent(gw, "fit-expanded", metered, until=int(0.3 * WINDOW))
    for number in range(24):
        agent.tool_round()
        if number % 3 == 0:
            gw.memory.flush(10)
            agent.messages.append({"role": "assistant", "content": [
                {"type": "text", "text": "Noted."}]})
            agent.messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Which handlers matched in step {number}?"}]})
            status, raw = agent.send(f"recall:handler request grep src module {number}",
                                     stream=False)
            assert status == 200, raw
            # The agent keeps the answer (with the gateway's anchor) and goes on.
            agent.messages.append({"role": "assistant", "content": orjson.loads(raw)["content"]})
            agent.messages.append({"role": "user", "content": [
                {"type": "text", "text": f"Go on with step {number}."}]})
        assert agent.send()[0] == 200
    sent = agent_requests(metered)
    assert sum(b"lore-recall" in r.body for r in sent) == 0  # every anchor expanded
    assert list(metered.refusals) == []
    assert max(tokens(r) for r in sent) <= CEILING * WINDOW
