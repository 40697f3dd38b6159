"""Long-term knowledge: entries per project, curated from distillations.

``store`` (entries in the database), ``curator`` (the worker job that turns
distillations into entries), ``block`` (rendering for the prompt), ``inject``
(the pure request transform), ``sessions`` (each session's frozen block),
``export`` (``.lore.md`` and the pointer in AGENTS.md / CLAUDE.md), ``sidechannel``
(requests that get nothing).
"""
