"""The gateway's reading of routing annotations (pure parts)."""

from __future__ import annotations

import pytest

from turnout.controller.claim_sources import effective_phase
from turnout.core.claims import ClaimPhase
from turnout.core.reconcile import parse_route


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        ('{"model":"m","port":30001,"state":"active"}', (30001, "active")),
        ('{"model":"m","port":0,"state":"sleeping"}', (0, "sleeping")),
        ('{"model":"m","port":70000,"state":"active"}', (0, "active")),
        ('{"model":"m","port":"30001"}', (0, None)),
        ("not json", (0, None)),
        ("[1]", (0, None)),
        (None, (0, None)),
    ],
)
def test_parse_route(note: str | None, expected: tuple[int, str | None]) -> None:
    assert parse_route(note) == expected


@pytest.mark.parametrize(
    ("phase", "state", "routable", "expected"),
    [
        (ClaimPhase.ACTIVE, "sleeping", False, ClaimPhase.SLEEPING),  # de-routed for sleep, status not written yet
        (ClaimPhase.ACTIVE, "restarting", False, ClaimPhase.ACTIVATING),
        (ClaimPhase.SLEEPING, "booting", False, ClaimPhase.LOADING),  # waking: do not ask for another wake
        (ClaimPhase.ACTIVE, "active", True, ClaimPhase.ACTIVE),
        (ClaimPhase.PENDING, "pending", False, ClaimPhase.PENDING),
        # AIBrix's states
        (ClaimPhase.ACTIVE, "activating", False, ClaimPhase.ACTIVATING),  # crashed: de-routed, status lags
        (ClaimPhase.SLEEPING, "activating", False, ClaimPhase.ACTIVATING),  # waking: do not ask for another wake
        (ClaimPhase.LOADING, "activating", False, ClaimPhase.LOADING),  # on its way up: the status says more
        (ClaimPhase.ACTIVE, "failed", False, ClaimPhase.FAILED),
        (ClaimPhase.FAILED, None, False, ClaimPhase.FAILED),
    ],
)
def test_route_state_wins_while_the_status_lags(
    phase: ClaimPhase, state: str | None, routable: bool, expected: ClaimPhase
) -> None:
    assert effective_phase(phase, state, routable) is expected
