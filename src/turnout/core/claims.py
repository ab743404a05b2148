"""ModelClaim rules (AIBrix ModelClaim design): spec validation and candidate pod ranking.

Pure: the controller drivers (local, Kubernetes) turn objects into these values and apply the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from turnout.core.engine_args import EngineArgs, InvalidEngineArgs, judge_engine_args
from turnout.core.engine_args import schedules_by_priority as _args_schedule_by_priority
from turnout.core.priority import Ordering
from turnout.core.runtime import ENGINES, artifact_problem
from turnout.core.selectors import InvalidSelector, LabelSelector, parse_label_selector

__all__ = [
    "POOL_LABEL",
    "ClaimPhase",
    "ClaimSpec",
    "InvalidClaim",
    "PodView",
    "artifact_key",
    "candidates",
    "parse_claim_spec",
    "rank_pods",
    "schedules_by_priority",
]

POOL_LABEL = "pool.aibrix.ai/enabled"


class ClaimPhase(StrEnum):
    PENDING = "Pending"
    SCHEDULING = "Scheduling"
    LOADING = "Loading"
    ACTIVATING = "Activating"
    ACTIVE = "Active"
    SLEEPING = "Sleeping"
    FAILED = "Failed"


class InvalidClaim(ValueError):
    """The claim cannot be placed as written; the message is the status reason to show."""


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    model_name: str
    pod_selector: LabelSelector
    artifact_url: str
    engine: str = "vllm"
    replicas: int = 1
    args: Mapping[str, str] = field(default_factory=dict)

    @property
    def parallel_gpus(self) -> int:
        """GPUs one replica needs: tensor x pipeline parallel size, in whatever spelling the engine takes."""
        return _judged_args(self.engine, self.args).gpus


def _judged_args(engine: str, args: Mapping[str, str]) -> EngineArgs:
    try:
        return judge_engine_args(engine, args)
    except InvalidEngineArgs as exc:
        raise InvalidClaim(str(exc)) from None


def parse_claim_spec(name: str, spec: Any) -> ClaimSpec:
    if not isinstance(spec, dict):
        raise InvalidClaim("spec must be an object")
    model = spec.get("modelName") or name
    if not isinstance(model, str):
        raise InvalidClaim("spec.modelName must be a string")
    if spec.get("podSelector") is None:
        raise InvalidClaim("spec.podSelector is required: {matchLabels: {label: value}, matchExpressions: [...]}")
    try:
        selector = parse_label_selector(spec["podSelector"], "spec.podSelector")
    except InvalidSelector as exc:
        raise InvalidClaim(str(exc)) from None
    artifact = spec.get("artifactURL")
    if not isinstance(artifact, str) or not artifact:
        raise InvalidClaim("spec.artifactURL is required")
    problem = artifact_problem(artifact)
    if problem is not None:
        raise InvalidClaim(f"spec.artifactURL {problem}")
    engine = spec.get("engine", "vllm")
    if engine not in ENGINES:
        raise InvalidClaim(f"spec.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    replicas = spec.get("replicas", 1)
    if replicas != 1:
        raise InvalidClaim(f"spec.replicas must be 1 (one engine per claim), got {replicas!r}")
    config = spec.get("engineConfig") or {}
    args = config.get("args", {}) if isinstance(config, dict) else None
    if isinstance(args, dict):  # a flag without a value may arrive as null (how some API servers treat "")
        args = {k: "" if v is None else v for k, v in args.items()}
    if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in args.items()):
        raise InvalidClaim('spec.engineConfig.args must be a map of strings ("" for a boolean flag)')
    _judged_args(engine, args)  # every rule on the args, in every spelling the engine takes
    return ClaimSpec(model, selector, artifact, engine, 1, dict(args))


def claim_engine(name: str, spec: Any) -> str | None:
    """The engine a claim with ``spec`` runs (one of :data:`turnout.core.runtime.ENGINES`); None for a spec that
    is not a valid claim."""
    try:
        return parse_claim_spec(name, spec).engine
    except InvalidClaim:
        return None


def schedules_by_priority(name: str, spec: Any) -> Ordering | None:
    """How the engine of a claim with ``spec`` orders requests by their own priority (vLLM's
    ``--scheduling-policy priority``, SGLang's ``--enable-priority-scheduling`` in its args:
    :func:`turnout.core.engine_args.schedules_by_priority`); None: it does not, or a spec that is not a valid
    claim."""
    try:
        claim = parse_claim_spec(name, spec)
    except InvalidClaim:
        return None
    return _args_schedule_by_priority(claim.engine, claim.args)


@dataclass(frozen=True, slots=True)
class PodView:
    name: str
    labels: Mapping[str, str]
    running: bool
    address: str | None
    gpus: int
    free_hbm_bytes: int | None = None
    kv_used_bytes: int | None = None
    models: int = 0
    load: float = 0.0
    cached_artifacts: frozenset[str] = frozenset()  # artifact_key() of what the pod has cached or runs


def artifact_key(url: str) -> str:
    """One name per artifact: ``huggingface://X`` and ``hf://X`` are the same model."""
    return "hf://" + url.removeprefix("huggingface://") if url.startswith("huggingface://") else url


def candidates(claim: ClaimSpec, pods: Sequence[PodView]) -> int:
    """The claim's status ``candidates`` (AIBrix's ``ModelClaimStatus.Candidates``): pool pods that match its
    selector, run with an address, and have the GPUs it needs."""
    return len(rank_pods(claim, pods)[0])


def rank_pods(claim: ClaimSpec, pods: Sequence[PodView]) -> tuple[list[PodView], str]:
    """Eligible pods best first, and when there are none, why (for the claim's status)."""
    selected = [p for p in pods if claim.pod_selector.matches(p.labels)]
    if not selected:
        return [], "no pod matches spec.podSelector"
    pooled = [p for p in selected if p.labels.get(POOL_LABEL) == "true"]
    if not pooled:
        return [], f'matching pods lack the label {POOL_LABEL}: "true"'
    ready = [p for p in pooled if p.running and p.address]
    if not ready:
        return [], "no matching pool pod is running with an address yet"
    sized = [p for p in ready if p.gpus == claim.parallel_gpus]
    if not sized:
        gpus = sorted({p.gpus for p in ready})
        return [], (
            f"tensor x pipeline parallel size is {claim.parallel_gpus} but the pool pods have "
            f"{'/'.join(map(str, gpus))} GPUs; set them to match"
        )

    def key(p: PodView) -> tuple[Any, ...]:
        return (
            artifact_key(claim.artifact_url) not in p.cached_artifacts,
            -(p.free_hbm_bytes or 0),
            p.kv_used_bytes or 0,
            p.models,
            p.load,
            p.name,
        )

    return sorted(sized, key=key), ""
