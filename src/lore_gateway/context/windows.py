"""Model context windows and provider prompt-cache lifetimes (pure tables).

Budgets are shares of a model's window. Names match by prefix, longest first, so
dated snapshots (``claude-sonnet-4-5-20250929``) find their family; an unknown
model gets :data:`DEFAULT_WINDOW`, which ``LORE_CONTEXT_WINDOW`` overrides.
"""

from __future__ import annotations

from lore_gateway.routing import Family

# The window every agent meters against unless it opted into more: Claude Code
# and Codex both compact relative to ~200K on their default models.
DEFAULT_WINDOW = 200_000

# Prefix -> input window in tokens (provider model pages, Dec 2026). 1M-context
# Anthropic variants need a beta header; the client then meters 1M itself, but
# the budget stays on the 200K figure unless the setting says otherwise.
MODEL_WINDOWS: dict[str, int] = {
    "claude-": 200_000,
    "gpt-5": 272_000,
    "gpt-4.1": 1_000_000,
    "gpt-4o": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "codex-": 272_000,
}
_PREFIXES = sorted(MODEL_WINDOWS, key=len, reverse=True)

# How long a provider keeps a prefix cached after its last use (wave2-memory §5):
# Anthropic's default ephemeral TTL is 5 minutes (1 h when the request asks for
# it); OpenAI's in-memory retention is 5-10 minutes of inactivity, so the
# shorter figure is the safe one (a prefix we think cold is then really cold).
CACHE_TTL_S: dict[Family, float] = {
    Family.ANTHROPIC: 300.0,
    Family.RESPONSES: 300.0,
    Family.CHAT: 300.0,
}
ANTHROPIC_LONG_TTL_S = 3_600.0
OPENAI_24H_TTL_S = 86_400.0


def window_for(model: str | None, default: int = DEFAULT_WINDOW) -> int:
    """The model's input window in tokens (``default`` when unknown)."""
    name = (model or "").lower()
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return MODEL_WINDOWS[prefix]
    return default


def cache_ttl(family: Family, payload: dict[str, object]) -> float:
    """Seconds a cached prefix of this request stays warm without traffic."""
    if family is Family.ANTHROPIC and '"ttl": "1h"' in _cache_controls(payload):
        return ANTHROPIC_LONG_TTL_S
    if payload.get("prompt_cache_retention") == "24h":
        return OPENAI_24H_TTL_S
    return CACHE_TTL_S[family]


def _cache_controls(payload: dict[str, object]) -> str:
    """The request's system and tool cache markers, as text (small: no history)."""
    parts: list[str] = []
    for key in ("system", "tools"):
        blocks = payload.get(key)
        if isinstance(blocks, list):
            for block in blocks:
                if isinstance(block, dict) and isinstance(block.get("cache_control"), dict):
                    ttl = block["cache_control"].get("ttl")
                    parts.append(f'"ttl": "{ttl}"')
    return " ".join(parts)
