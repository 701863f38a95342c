"""Lantern's benchmark harness: raw in-process baseline, bare HTTP ceiling and served runs.

Run ``python -m bench`` (``--quick`` for a short pass); see ``docs/performance.md``.
"""
