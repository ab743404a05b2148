"""The ModelClaim reconcile plan: from claims, pods and what their agents report, to actions.

Pure. A driver (local files or Kubernetes) builds the inputs each tick, applies the actions through its
adapter (agent HTTP calls, status writes, pod annotations, finalizers), and calls again next tick.

An activation the agent refuses as invalid (HTTP 400: an artifact scheme or args it does not take) is terminal:
the driver applies :func:`rejected` (de-route, ``Failed`` with the agent's reason, unbound) and passes the
rejection back in :attr:`ClaimState.rejected` while the spec is unchanged, so the claim stays ``Failed`` and is
not activated again. A claim's ``Activate`` is always its last action, so nothing else of it follows a
rejection within the tick. Event types are :func:`event_type`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from turnout.core.claims import ClaimPhase, ClaimSpec, PodView, rank_pods

__all__ = [
    "ANNOTATION_PREFIX",
    "NO_CANDIDATE",
    "REJECTED",
    "Activate",
    "Annotate",
    "ClaimState",
    "Deactivate",
    "EngineInfo",
    "PodState",
    "ReleaseFinalizer",
    "SetStatus",
    "announces",
    "conditions",
    "download_detail",
    "event_type",
    "launch_key",
    "parse_route",
    "plan",
    "rejected",
    "route_annotation",
    "route_state",
]

ANNOTATION_PREFIX = "modelclaim.aibrix.ai/"
REJECTED = "ActivationRejected"  # the status reason of a claim whose activation the agent refused as invalid
NO_CANDIDATE = "NoCandidatePod"  # the status reason of a claim that stays Scheduling: no pod it could run on
# Reasons that are Warning events whatever the phase: a crashed engine restarting, an agent not answering, a
# claim no pod can take.
_WARNING_REASONS = frozenset({"AgentUnreachable", "Restarting", "EngineFailed", REJECTED, NO_CANDIDATE})


LaunchKey = tuple[str, str, tuple[tuple[str, str], ...]]  # (engine, artifact URL, sorted args)


def launch_key(spec: ClaimSpec) -> LaunchKey:
    """What an engine was started from; a claim whose key changed needs a new engine."""
    return spec.engine, spec.artifact_url, tuple(sorted(spec.args.items()))


@dataclass(frozen=True, slots=True)
class EngineInfo:
    phase: str  # the agent's engine phase
    ready: bool
    port: int
    last_error: str | None = None
    launched: LaunchKey | None = None  # None: not reported (no drift check)
    claim: str | None = None  # the claim the agent started it for
    detail: str | None = None  # what it is doing while it loads (its artifact's download: download_detail)


@dataclass(frozen=True, slots=True)
class PodState:
    pod: PodView
    engines: Mapping[str, EngineInfo] = field(default_factory=dict)  # by model name
    reachable: bool = True  # the agent answered this tick


@dataclass(frozen=True, slots=True)
class ClaimState:
    name: str
    spec: ClaimSpec | None
    invalid: str | None = None  # why the spec was refused
    bound_pod: str | None = None
    deleting: bool = False
    rejected: str | None = None  # the agent refused this very spec's activation as invalid (the reason)


@dataclass(frozen=True, slots=True)
class SetStatus:
    claim: str
    phase: ClaimPhase
    reason: str
    message: str = ""
    pod: str | None = None
    port: int = 0  # where the claim is routable: 0 unless Active
    # The engine's port as its agent reports it, whatever the phase (AIBrix's ``instances[].port``); None: the
    # agent did not answer this time, so the last known port stands.
    engine_port: int | None = 0


@dataclass(frozen=True, slots=True)
class Activate:
    claim: str
    pod: str
    spec: ClaimSpec


@dataclass(frozen=True, slots=True)
class Deactivate:
    claim: str
    pod: str
    model: str


@dataclass(frozen=True, slots=True)
class Annotate:
    pod: str
    key: str
    value: str | None  # None removes the annotation


@dataclass(frozen=True, slots=True)
class ReleaseFinalizer:
    claim: str


Action = SetStatus | Activate | Deactivate | Annotate | ReleaseFinalizer


def route_state(engine: EngineInfo | None) -> str:
    """AIBrix's routing states (``pkg/constants/model.go``, ``ModelClaimRoutingState*``): ``active`` (ready to
    serve), ``sleeping``, ``failed``, and ``activating`` for everything on its way up (placed, booting,
    restarting after a crash, active but not ready)."""
    if engine is None:
        return "activating"
    if engine.phase == "active":
        return "active" if engine.ready else "activating"
    return engine.phase if engine.phase in ("sleeping", "failed") else "activating"


def route_annotation(model: str, engine: EngineInfo | None) -> str:
    """``{"model","port","state"}`` as AIBrix's controller writes it; the port is 0 unless the state is
    ``active``."""
    state = route_state(engine)
    port = engine.port if engine is not None and state == "active" else 0
    return json.dumps({"model": model, "port": port, "state": state}, separators=(",", ":"))


def event_type(status: SetStatus) -> str:
    """The Kubernetes event type of a phase change: ``Warning`` for failures, crashes, unreachable agents and
    claims that cannot be placed (``NoCandidatePod``; ``Pending``, as earlier Turnout wrote it); ``Normal``
    otherwise."""
    if status.phase in (ClaimPhase.FAILED, ClaimPhase.PENDING) or status.reason in _WARNING_REASONS:
        return "Warning"
    return "Normal"


def announces(before: ClaimPhase | None, before_reason: str | None, status: SetStatus) -> bool:
    """Whether a status write is an event (both drivers record one then): a phase change, or a claim that stays
    ``Scheduling`` while it finds no pod (``NoCandidatePod``) and then is placed, or the other way round."""
    if before is not status.phase:
        return True
    return (before_reason == NO_CANDIDATE) != (status.reason == NO_CANDIDATE)


def rejected(claim: str, pod: str, model: str, why: str) -> list[Action]:
    """What follows an activation the agent on ``pod`` refused as invalid: off the route, ``Failed`` with the
    agent's reason and no pod (nothing runs there), until the spec changes."""
    message = f"the runtime agent on {pod} refused the activation of {model}: {why}"
    return [Annotate(pod, ANNOTATION_PREFIX + claim, None), SetStatus(claim, ClaimPhase.FAILED, REJECTED, message)]


def conditions(status: SetStatus) -> list[tuple[str, bool, str, str]]:
    """The claim's conditions as (type, status, reason, message): ``Scheduled`` (bound to a pod) and ``Ready``
    (Active and routable)."""
    scheduled = status.pod is not None
    return [
        (
            "Scheduled",
            scheduled,
            "Scheduled" if scheduled else status.reason,
            f"bound to {status.pod}" if scheduled else status.message,
        ),
        ("Ready", status.phase is ClaimPhase.ACTIVE, status.reason, status.message),
    ]


def parse_route(note: str | None) -> tuple[int, str | None]:
    """Port and engine state of a ``modelclaim.aibrix.ai/<claim>`` annotation; port 0 when absent, unroutable or
    malformed."""
    if not note:
        return 0, None
    try:
        data = json.loads(note)
        port, state = data.get("port"), data.get("state")
    except (ValueError, AttributeError):
        return 0, None
    port = port if isinstance(port, int) and 0 < port < 65536 else 0
    return port, state if isinstance(state, str) else None


def plan(claims: Sequence[ClaimState], pods: Sequence[PodState]) -> list[Action]:
    by_name = {p.pod.name: p for p in pods}
    actions: list[Action] = []
    for claim in claims:
        key = ANNOTATION_PREFIX + claim.name
        bound = by_name.get(claim.bound_pod) if claim.bound_pod else None
        if claim.deleting:
            actions += _delete(claim, bound, key)
            continue
        if claim.spec is None:
            actions.append(SetStatus(claim.name, ClaimPhase.FAILED, "InvalidSpec", claim.invalid or "invalid spec"))
            continue
        spec = claim.spec
        if claim.rejected is not None:
            actions.append(SetStatus(claim.name, ClaimPhase.FAILED, REJECTED, claim.rejected))
            continue
        if bound is None or not bound.pod.running or not bound.pod.address:
            ranked, why = rank_pods(spec, [p.pod for p in pods])
            silent = sorted(p.name for p in ranked if not by_name[p.name].reachable)
            ranked = [p for p in ranked if by_name[p.name].reachable]
            if not ranked and silent:
                why = f"the runtime agent on {', '.join(silent)} does not answer yet"
            if not ranked:  # it remains Scheduling (AIBrix's ModelClaim design), unbound, and is placed later
                actions.append(SetStatus(claim.name, ClaimPhase.SCHEDULING, NO_CANDIDATE, why))
                continue
            target = ranked[0].name
            actions.append(SetStatus(claim.name, ClaimPhase.SCHEDULING, "Scheduled", f"placed on {target}", target))
            actions.append(Annotate(target, key, route_annotation(spec.model_name, None)))
            actions.append(Activate(claim.name, target, spec))
            continue
        if not bound.reachable:
            actions.append(
                SetStatus(
                    claim.name,
                    ClaimPhase.ACTIVATING,
                    "AgentUnreachable",
                    f"the runtime agent on {bound.pod.name} did not answer",
                    bound.pod.name,
                    engine_port=None,
                )
            )
            continue
        for model, other in bound.engines.items():  # the claim's modelName changed: its old engine goes
            if other.claim == claim.name and model != spec.model_name:
                actions.append(Deactivate(claim.name, bound.pod.name, model))
        engine = bound.engines.get(spec.model_name)
        if engine is not None and engine.launched is not None and engine.launched != launch_key(spec):
            actions.append(Annotate(bound.pod.name, key, route_annotation(spec.model_name, None)))
            actions.append(Deactivate(claim.name, bound.pod.name, spec.model_name))
            actions.append(
                SetStatus(
                    claim.name,
                    ClaimPhase.LOADING,
                    "SpecChanged",
                    "engine, artifact or args changed: restarting the engine",
                    bound.pod.name,
                )
            )
            continue
        actions.append(Annotate(bound.pod.name, key, route_annotation(spec.model_name, engine)))
        actions.append(_status_for(claim.name, bound.pod.name, engine))
        if engine is None:
            actions.append(Activate(claim.name, bound.pod.name, spec))
    return actions


def _status_for(claim: str, pod: str, engine: EngineInfo | None) -> SetStatus:
    """The claim's status from its engine. The engine's port is reported in every phase, as AIBrix's controller
    does (vllm-project/aibrix ``pkg/controller/modelclaim/modelclaim_controller.go``: an instance gets the
    activation's port while Activating and then the snapshot's, whatever its phase); only ``port`` (and the
    routing annotation) wait for Active."""
    if engine is None:
        return SetStatus(claim, ClaimPhase.LOADING, "Activating", "engine requested", pod)
    at = engine.port
    if engine.phase == "active" and engine.ready:
        return SetStatus(claim, ClaimPhase.ACTIVE, "Ready", "", pod, engine.port, at)
    if engine.phase == "sleeping":
        return SetStatus(claim, ClaimPhase.SLEEPING, "Sleeping", "", pod, engine_port=at)
    if engine.phase == "failed":
        return SetStatus(claim, ClaimPhase.FAILED, "EngineFailed", engine.last_error or "", pod, engine_port=at)
    if engine.phase == "restarting":
        return SetStatus(claim, ClaimPhase.ACTIVATING, "Restarting", engine.last_error or "", pod, engine_port=at)
    if engine.detail:
        return SetStatus(claim, ClaimPhase.LOADING, "Downloading", engine.detail, pod, engine_port=at)
    return SetStatus(claim, ClaimPhase.LOADING, "Loading", engine.phase, pod, engine_port=at)


def _size(n: int) -> str:
    """Bytes for a person: ``512 B``, ``1.5 MiB``, ``4.0 GiB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def download_detail(download: object) -> str | None:
    """The claim's status message while the agent downloads its engine's artifact (the snapshot's ``download``:
    ``{url, bytes_done, bytes_total, files_done, files_total}``), e.g. ``downloading s3://b/m: 1.5 GiB of 4.0 GiB
    (37 %), 3 of 9 files``; None when there is no download or the report is not of that shape."""
    if not isinstance(download, dict) or not isinstance(download.get("url"), str):
        return None
    done, total = download.get("bytes_done"), download.get("bytes_total")
    files, files_total = download.get("files_done"), download.get("files_total")
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        return None
    text = f"downloading {download['url']}: {_size(done)}"
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        text += f" of {_size(total)} ({min(100, done * 100 // total)} %)"
    else:
        text += " (listing its objects)" if done == 0 else ""
    if isinstance(files, int) and isinstance(files_total, int) and files_total > 1:
        text += f", {files} of {files_total} files"
    return text


def _delete(claim: ClaimState, bound: PodState | None, key: str) -> list[Action]:
    """De-route first, then stop the engine, then let the object go."""
    if bound is None:
        return [ReleaseFinalizer(claim.name)]
    model = claim.spec.model_name if claim.spec is not None else claim.name
    actions: list[Action] = [Annotate(bound.pod.name, key, None)]
    if model in bound.engines:
        actions.append(Deactivate(claim.name, bound.pod.name, model))
    elif bound.reachable:
        actions.append(ReleaseFinalizer(claim.name))
    return actions
