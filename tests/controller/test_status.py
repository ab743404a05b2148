"""Claim statuses: Turnout's fields and AIBrix's (candidates, desiredReplicas, instances), read back either way."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.controller.status import bound_pod, render_status
from turnout.core.claims import ClaimPhase
from turnout.core.reconcile import SetStatus

NOW = "2026-12-03T18:00:00Z"


def test_status_carries_aibrix_fields() -> None:
    active = render_status(SetStatus("c", ClaimPhase.ACTIVE, "Ready", "", "pod-0", 20001), {}, NOW, "m", candidates=3)
    assert active["candidates"] == 3 and active["desiredReplicas"] == 1 and active["readyReplicas"] == 1
    assert active["instances"] == [{"pod": "pod-0", "port": 20001, "phase": "Active"}]
    pending = render_status(SetStatus("c", ClaimPhase.PENDING, "NoCandidatePod", "none"), {}, NOW, "m")
    assert pending["candidates"] == 0 and pending["instances"] == [] and pending["readyReplicas"] == 0


@pytest.mark.parametrize(
    ("status", "pod"),
    [
        ({"pod": "turnout-0"}, "turnout-0"),
        ({"instances": [{"pod": "aibrix-0", "port": 20000, "phase": "Active"}]}, "aibrix-0"),  # AIBrix placed it
        ({"pod": "turnout-0", "instances": [{"pod": "other"}]}, "turnout-0"),
        ({"pod": None, "instances": []}, None),
        ({"instances": [{"port": 1}]}, None),
        (None, None),
    ],
)
def test_bound_pod_reads_either_status(status: Any, pod: str | None) -> None:
    assert bound_pod(status) == pod
