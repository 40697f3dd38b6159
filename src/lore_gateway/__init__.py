"""lore-gateway: a transparent memory proxy for AI coding agents."""

__version__ = "0.1.0"
