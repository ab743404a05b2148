"""A claim's status object, the same for both drivers (the Kubernetes one writes it to the status subresource).

A claim whose activation the agent refused as invalid keeps ``rejectedSpec`` (a digest of the spec refused) in
its status, so that it stays ``Failed`` without a retry until its spec changes (:func:`rejection`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from turnout.controller.agents import spec_digest
from turnout.core.claims import ClaimPhase, ClaimSpec
from turnout.core.reconcile import REJECTED, SetStatus, conditions

__all__ = ["bound_pod", "now_iso", "phase_of", "rejection", "render_status"]


def now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def phase_of(status: Mapping[str, Any] | None) -> ClaimPhase | None:
    value = (status or {}).get("phase")
    try:
        return None if value is None else ClaimPhase(value)
    except ValueError:
        return None


def rejection(status: Mapping[str, Any] | None, spec: ClaimSpec | None) -> str | None:
    """The agent's refusal recorded in ``status`` when it was for this very spec, else None (try again)."""
    status = status or {}
    if spec is None or status.get("reason") != REJECTED or status.get("rejectedSpec") != spec_digest(spec):
        return None
    return str(status.get("message") or REJECTED)


def bound_pod(status: Mapping[str, Any] | None) -> str | None:
    """The pod a claim is bound to: Turnout's ``pod``, else the first of AIBrix's ``instances[]`` (a claim an
    AIBrix controller placed)."""
    status = status or {}
    pod = status.get("pod")
    if isinstance(pod, str) and pod:
        return pod
    instances = status.get("instances")
    first = instances[0] if isinstance(instances, list) and instances else None
    pod = first.get("pod") if isinstance(first, Mapping) else None
    return pod if isinstance(pod, str) and pod else None


def render_status(
    action: SetStatus,
    previous: Mapping[str, Any],
    now: str,
    model: str,
    spec: ClaimSpec | None = None,
    *,
    candidates: int = 0,
) -> dict[str, Any]:
    """The new status; transition times are kept from ``previous`` for whatever did not change. ``spec``: the
    claim's spec, recorded as ``rejectedSpec`` when the status says its activation was refused. Besides
    Turnout's fields it carries AIBrix's ``ModelClaimStatus`` ones (``candidates``: pool pods the claim could
    run on; ``desiredReplicas``; ``instances[]``: ``{pod, port, phase}`` of its engine, with the engine's port
    in every phase, as AIBrix reports it, where Turnout's ``port`` is the routable one)."""
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
    refused = spec_digest(spec) if action.reason == REJECTED and spec is not None else None
    return {
        "phase": action.phase.value,
        "reason": action.reason,
        "message": action.message,
        "model": model,
        "pod": action.pod,
        "port": action.port,
        "readyReplicas": 1 if action.phase is ClaimPhase.ACTIVE else 0,
        "candidates": candidates,
        "desiredReplicas": 1,  # spec.replicas, which is always 1
        "instances": []
        if action.pod is None
        else [{"pod": action.pod, "port": _engine_port(action, previous), "phase": action.phase.value}],
        "lastTransitionTime": previous.get("lastTransitionTime", now) if same else now,
        "conditions": rendered,
        "rejectedSpec": refused,  # null otherwise (a merge patch removes it)
    }


def _engine_port(action: SetStatus, previous: Mapping[str, Any]) -> int:
    """The engine's port for ``instances[]``: as reported now, else (its agent did not answer) the last known
    one on the same pod; AIBrix too keeps the instance's port when a snapshot fails."""
    if action.engine_port is not None:
        return action.engine_port or action.port
    instances = previous.get("instances")
    last = instances[0] if isinstance(instances, list) and instances else None
    if isinstance(last, Mapping) and last.get("pod") == action.pod and isinstance(last.get("port"), int):
        return int(last["port"])
    return action.port
