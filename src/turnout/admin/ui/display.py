"""How the admin UI's pages show values: times, byte sizes and JSON, the same way on every page.

Used by the Endpoints, Keys, Usage, Audit, Runtime pools and Persistence pages (passed to their templates as
``when``, ``size`` and ``pretty``). Times are shown in UTC (a gateway's operators may sit in several time
zones; the audit log and the CLI speak UTC too) and carry their machine-readable form for ``<time>``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = ["changed_keys", "iso", "pretty", "size", "when"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def iso(ts: float | None) -> str:
    """``2026-12-03T14:32:05Z`` (the ``datetime`` attribute of ``<time>``); "" for no time."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def when(ts: float | None) -> str:
    """``2026-12-03 14:32:05 UTC``; "" for no time."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def size(count: int | None) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 GiB``; "" when unknown."""
    if count is None:
        return ""
    value = float(count)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"  # not reached


def pretty(value: Any) -> str:
    """JSON indented by two spaces, keys sorted (what the audit page shows of a before/after)."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def changed_keys(before: Any, after: Any) -> set[str]:
    """The top-level keys whose values differ between two JSON objects (all keys of either when one of them
    is not an object): the audit page marks these on both sides."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return set(before) if isinstance(before, dict) else set(after) if isinstance(after, dict) else set()
    return {k for k in before.keys() | after.keys() if before.get(k, _MISSING) != after.get(k, _MISSING)}


_MISSING = object()
