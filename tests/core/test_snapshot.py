"""Snapshots read into AIBrix's names, from AIBrix's runtime and from earlier Turnout agents alike."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.core.snapshot import known, read_model, read_snapshot

AIBRIX = {
    "model_name": "m",
    "restart_count": 2,
    "request_metrics_observed": True,
    "requests_running": 3,
    "requests_waiting": 1,
    "request_success_total": 9,
}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (AIBRIX, AIBRIX),
        (
            {"model_name": "m", "restarts": 2, "requests": {"running": 3, "waiting": 1, "success_total": 9}},
            AIBRIX,
        ),
        (
            {"model_name": "m", "restarts": 0, "requests": {"running": None, "waiting": None, "success_total": None}},
            {
                "model_name": "m",
                "restart_count": 0,
                "request_metrics_observed": False,
                "requests_running": 0,
                "requests_waiting": 0,
                "request_success_total": None,
            },
        ),
        (
            {"model_name": "m"},
            {
                "model_name": "m",
                "restart_count": 0,
                "request_metrics_observed": False,
                "requests_running": 0,
                "requests_waiting": 0,
                "request_success_total": None,
            },
        ),
        (  # AIBrix's names win where both are present
            {**AIBRIX, "restarts": 7, "requests": {"running": 0}},
            AIBRIX,
        ),
    ],
)
def test_read_model(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert read_model(raw) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (0, 0), (-1, None), (None, None), (True, None), ("5", None), (2.0, 2)],
)
def test_known(value: Any, expected: int | None) -> None:
    assert known(value) == expected


def test_read_snapshot_either_spelling() -> None:
    aibrix = {
        "observed_at": "2026-12-03T18:00:00Z",
        "accelerators": [
            {"id": "GPU-a", "hbm_total_bytes": 10, "hbm_free_bytes": 4},
            {"id": "GPU-b", "hbm_total_bytes": 10, "hbm_free_bytes": 5},
        ],
        "models": [AIBRIX, {"no": "name"}],
        "cached_artifacts": ["s3://b/m"],
    }
    snap = read_snapshot(aibrix)
    assert snap is not None and snap.models == [AIBRIX] and snap.free_hbm_bytes == 9
    assert snap.cached_artifacts == frozenset({"s3://b/m"})
    old = read_snapshot({"ts": 1.0, "engines": [{"model_name": "m", "restarts": 1}], "accelerators": []})
    assert old is not None and old.models[0]["restart_count"] == 1 and old.free_hbm_bytes is None
    unreadable = read_snapshot({"accelerators": [{"id": "x", "hbm_free_bytes": -1}], "models": []})
    assert unreadable is not None and unreadable.free_hbm_bytes is None
    assert read_snapshot({"status": "ok"}) is None and read_snapshot([]) is None
