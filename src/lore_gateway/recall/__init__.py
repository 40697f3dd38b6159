"""The hidden recall tool: definition, markers, budget, execution, follow-ups, and
the per-protocol interceptors that keep recall out of the client's sight.

See docs/recall.md.
"""
