"""How the operator pages show values (turnout.admin.ui.display): times, sizes, counts, latencies, changes."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.admin.ui.display import changes, iso, ms, number, size, when, when_iso


@pytest.mark.parametrize(
    ("fn", "value", "shown"),
    [
        (when, 0.0, "1970-01-01 00:00:00 UTC"),
        (when, None, ""),
        (iso, 1_796_310_693.9, "2026-12-03T15:11:33Z"),
        (when_iso, "2026-12-03T15:11:33Z", "2026-12-03 15:11:33 UTC"),
        (when_iso, "not a time", "not a time"),
        (when_iso, None, ""),
        (size, 512, "512 B"),
        (size, 1536, "1.5 KiB"),
        (size, 3 * 1024**3, "3.0 GiB"),
        (size, None, ""),
        (number, 2_000_000, "2\u202f000\u202f000"),
        (number, 999, "999"),
        (number, None, "\u2013"),
        (ms, 0.44, "0.4 ms"),
        (ms, 1250.4, "1\u202f250 ms"),
        (ms, None, "\u2013"),
    ],
)
def test_values(fn: Any, value: Any, shown: str) -> None:
    assert fn(value) == shown


def test_changes_name_only_what_changed_and_show_times_as_times() -> None:
    before = {"rpm": 60, "models": ["model:*"], "revoked_at": None, "state": "active"}
    after = {"rpm": 120, "models": ["model:*"], "revoked_at": 0.0, "state": "revoked", "new": True}
    assert changes(before, after) == [
        {"field": "new", "before": "", "after": "true"},
        {"field": "revoked_at", "before": "null", "after": "1970-01-01 00:00:00 UTC"},
        {"field": "rpm", "before": "60", "after": "120"},
        {"field": "state", "before": '"active"', "after": '"revoked"'},
    ]
    assert changes(None, after) == [] and changes(before, "text") == []
