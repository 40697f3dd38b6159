"""Benchmarks behind ``lore bench``: each module measures one thing and returns figures."""
