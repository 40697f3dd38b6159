"""Model context windows (a pure table).

Budgets are shares of a model's window. Names match by prefix, longest first, so
dated snapshots (``claude-sonnet-4-5-20250929``) find their family; an unknown
model gets :data:`DEFAULT_WINDOW`, which ``LORE_CONTEXT_WINDOW`` overrides.
Prompt-cache lifetimes are each protocol's (``HistoryAdapter.cache_ttl``).
"""

from __future__ import annotations

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
    "gemini-": 1_048_576,
}
_PREFIXES = sorted(MODEL_WINDOWS, key=len, reverse=True)


def window_for(model: str | None, default: int = DEFAULT_WINDOW) -> int:
    """The model's input window in tokens (``default`` when unknown)."""
    name = (model or "").lower()
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return MODEL_WINDOWS[prefix]
    return default
