"""The gateway feeds the storage and prompt-cache metrics from real traffic."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from lore_gateway.obs import metrics
from lore_gateway.testing import FakeUpstream


def sample(name: str, **labels: str) -> float:
    body, _ = metrics.render()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_stored_turns_and_prompt_tokens_move(openai_client: Any, gateway: Any,
                                             fake_upstream: FakeUpstream) -> None:
    stored = sample("lore_stored_turns_total")
    prompt = sample("lore_prompt_input_tokens_total", protocol="responses")
    with openai_client.responses.stream(model="gpt-x", input="count me") as s:
        s.get_final_response()
    deadline = time.monotonic() + 10
    while sample("lore_stored_turns_total") < stored + 1 and time.monotonic() < deadline:
        gateway.memory.flush(timeout=5)
        time.sleep(0.01)
    assert sample("lore_stored_turns_total") == stored + 1
    assert sample("lore_prompt_input_tokens_total", protocol="responses") > prompt
    assert sample("lore_storage_queue_depth") == 0
