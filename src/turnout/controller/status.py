"""A claim's status object, the same for both drivers (the Kubernetes one writes it to the status subresource)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from turnout.core.claims import ClaimPhase
from turnout.core.reconcile import SetStatus, conditions

__all__ = ["now_iso", "phase_of", "render_status"]


def now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def phase_of(status: Mapping[str, Any] | None) -> ClaimPhase | None:
    value = (status or {}).get("phase")
    try:
        return None if value is None else ClaimPhase(value)
    except ValueError:
        return None


def render_status(action: SetStatus, previous: Mapping[str, Any], now: str, model: str) -> dict[str, Any]:
    """The new status; transition times are kept from ``previous`` for whatever did not change."""
    old_conditions = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, dict)}
    rendered = []
    for kind, ok, reason, message in conditions(action):
        flag = "True" if ok else "False"
        old = old_conditions.get(kind)
        since = old.get("lastTransitionTime", now) if old is not None and old.get("status") == flag else now
        rendered.append(
            {"type": kind, "status": flag, "reason": reason, "message": message, "lastTransitionTime": since}
        )
    same = previous.get("phase") == action.phase.value
    return {
        "phase": action.phase.value,
        "reason": action.reason,
        "message": action.message,
        "model": model,
        "pod": action.pod,
        "port": action.port,
        "readyReplicas": 1 if action.phase is ClaimPhase.ACTIVE else 0,
        "lastTransitionTime": previous.get("lastTransitionTime", now) if same else now,
        "conditions": rendered,
    }
