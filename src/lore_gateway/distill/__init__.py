"""Distillation: old conversation turned into dense, dated observation logs.

``format`` (the log format and its budget), ``extractive`` (a distiller with no
model call), ``segment`` (which stored messages form the next segment),
``prompts`` (what the worker model is asked), ``store`` (the database side).
"""
