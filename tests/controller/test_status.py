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
    ("phase", "reason"),
    [
        (ClaimPhase.SCHEDULING, "Scheduled"),
        (ClaimPhase.LOADING, "Loading"),
        (ClaimPhase.ACTIVATING, "Restarting"),
        (ClaimPhase.SLEEPING, "Sleeping"),
        (ClaimPhase.FAILED, "EngineFailed"),
    ],
)
def test_instances_carry_the_engine_port_before_it_is_routable(phase: ClaimPhase, reason: str) -> None:
    """AIBrix records the engine's port on the instance from the activation on, in every phase
    (pkg/controller/modelclaim/modelclaim_controller.go); only Turnout's ``port`` waits for Active."""
    status = render_status(SetStatus("c", phase, reason, "", "pod-0", 0, 20001), {}, NOW, "m")
    assert status["instances"] == [{"pod": "pod-0", "port": 20001, "phase": phase.value}]
    assert status["port"] == 0 and status["readyReplicas"] == 0


@pytest.mark.parametrize(
    ("previous_pod", "port"),
    [("pod-0", 20001), ("pod-1", 0)],  # the last known port, on the same pod only
)
def test_an_agent_that_does_not_answer_leaves_the_last_known_engine_port(previous_pod: str, port: int) -> None:
    previous = render_status(SetStatus("c", ClaimPhase.LOADING, "Loading", "", previous_pod, 0, 20001), {}, NOW, "m")
    unreachable = SetStatus("c", ClaimPhase.ACTIVATING, "AgentUnreachable", "", "pod-0", engine_port=None)
    assert render_status(unreachable, previous, NOW, "m")["instances"] == [
        {"pod": "pod-0", "port": port, "phase": "Activating"}
    ]


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
