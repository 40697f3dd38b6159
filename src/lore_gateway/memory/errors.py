"""Why memory could not answer: typed, so the recall side can name a failure
category instead of guessing from a message."""

from __future__ import annotations


class MemoryUnavailable(Exception):
    """Memory cannot answer right now (its search process is down or overloaded).
    The request goes on without it; the message says what happened."""


class SearchTimeout(MemoryUnavailable):
    """A search did not finish within the search timeout."""
