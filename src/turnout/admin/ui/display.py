"""How the admin UI's pages show values: times, byte sizes and JSON, the same way on every page.

Used by the Endpoints, Keys, Usage, Audit, Runtime pools and Persistence pages (passed to their templates as
``when``, ``size`` and ``pretty``). Times are shown in UTC (a gateway's operators may sit in several time
zones; the audit log and the CLI speak UTC too) and carry their machine-readable form for ``<time>``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

__all__ = ["changed_keys", "changes", "iso", "ms", "number", "pretty", "size", "when", "when_iso"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
UNKNOWN = "\u2013"  # an en dash, as the templates show a missing value


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


def when_iso(text: str | None) -> str:
    """An ISO time as the controller writes it (``2026-12-03T14:32:05Z``) shown like :func:`when`; text that is
    no such time is shown as it is."""
    if not text:
        return ""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return when(parsed.timestamp())


def ms(value: float | None) -> str:
    """A latency: ``0.4 ms`` below 10 ms, else whole milliseconds (grouped as :func:`number` does); a dash
    when unknown."""
    if value is None:
        return UNKNOWN
    return f"{value:.1f} ms" if value < 10 else f"{number(round(value))} ms"


def number(value: int | None) -> str:
    """A count with its thousands grouped by a narrow no-break space (``2 000 000``: read alike in English
    and German, where a comma or a point would mean the opposite); a dash when unknown."""
    if value is None:
        return UNKNOWN
    return f"{value:,}".replace(",", "\u202f")


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


def changes(before: Any, after: Any) -> list[dict[str, str]]:
    """The changed top-level fields of two JSON objects, each with its value before and after as compact JSON
    (times as times; "" where the field is absent), in field order: the audit page's side-by-side table."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    out = []
    for key in sorted(changed_keys(before, after)):
        out.append({"field": key, "before": _shown(key, before), "after": _shown(key, after)})
    return out


def _shown(key: str, record: dict[str, Any]) -> str:
    """One field's value as compact JSON; a time field (``*_at``, ``*_until``) holding epoch seconds as a time."""
    if key not in record:
        return ""
    value = record[key]
    if key.endswith(("_at", "_until")) and isinstance(value, int | float) and not isinstance(value, bool):
        return when(value)
    return orjson.dumps(value).decode()


def changed_keys(before: Any, after: Any) -> set[str]:
    """The top-level keys whose values differ between two JSON objects (all keys of either when one of them
    is not an object): the audit page marks these on both sides."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return set(before) if isinstance(before, dict) else set(after) if isinstance(after, dict) else set()
    return {k for k in before.keys() | after.keys() if before.get(k, _MISSING) != after.get(k, _MISSING)}


_MISSING = object()
