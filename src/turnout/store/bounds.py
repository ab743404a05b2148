"""Bounds of what the store keeps and returns, as plain numbers (no SQLAlchemy).

The store enforces them; the admin input models and the CLI's help texts quote them. Kept apart so that
`turnout --help` can say them without importing the database stack.
"""

from __future__ import annotations

__all__ = ["MAX_AUDIT_ENTRIES", "MAX_INT", "MAX_LATENCY_BUDGET_MS", "MAX_NAME", "MAX_URL"]

MAX_AUDIT_ENTRIES = 10_000  # the most audit entries one query returns
MAX_LATENCY_BUDGET_MS = 600_000  # 10 minutes: an endpoint's time to response headers before its fallback
MAX_INT = 2**31 - 1  # the largest value of the Integer columns (ids, rpm); daily_tokens is capped the same
MAX_NAME = 128  # app and tenant names (column width)
MAX_URL = 2048  # an endpoint URL (column width)
