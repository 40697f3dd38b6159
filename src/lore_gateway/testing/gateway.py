"""Settings and credentials for a gateway in front of the fake provider (tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lore_gateway.config import Settings
from lore_gateway.testing.fake_upstream import FakeUpstream

# Fake credentials: the gateway must send these upstream and nowhere else.
OPENAI_KEY = "sk-test-fake-key-0123456789"
ANTHROPIC_KEY = "sk-ant-test-fake-key-0123456789"


def gateway_settings(fake: FakeUpstream, data_dir: Path, **overrides: Any) -> Settings:
    """Settings for a gateway on a free loopback port, all upstreams on the fake."""
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "upstream_openai": fake.url,
        "upstream_chatgpt": fake.url + "/backend-api",
        "upstream_anthropic": fake.url,
        "upstream_gemini": fake.url,
        "data_dir": data_dir,
        "store": True,
        "embeddings": False,
        # Background work only where a test asks for it: a shared gateway must not
        # send worker requests (or add distillations) into other tests' traffic.
        "worker": False,
        "distill_segment_tokens": 1 << 40,
        "distill_idle_s": 1e9,
    }
    return Settings(**(values | overrides))
