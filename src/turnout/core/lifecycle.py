"""Applying a pool's policy each tick: KV capacity redistribution and idle sleep (pure).

A driver gathers, per pool pod, the policy annotation text and what the agent (or the gateway) observed of each
engine, calls :func:`pool_step` with the memory it kept from the previous tick, applies the actions, and keeps
the returned memory for the next tick. Time comes in as ``now``; nothing here reads a clock.

- An invalid policy disables the whole policy for that pool and yields one ``InvalidPoolPolicy`` event per
  distinct annotation text (not one per tick).
- Idle sleep: an engine that is active and ready sleeps once every observation for ``sleepAfterSeconds``
  showed it completely idle (nothing running, nothing waiting, no new completions). An observation with any
  of those counts unknown is not an idle one. The idle clock starts at the first observation of the engine
  ready (a woken engine's starts when it serves again, not when the wake was asked for), and a wake is
  activity: an engine seen asleep and then ready again stays awake at least :data:`WOKEN_HOLD_S` (twice the
  ``Retry-After`` the gateway gave the requests that woke it, :data:`RETRY_AFTER_S`), so no client that retries
  when told finds it asleep again, whatever ``sleepAfterSeconds`` says. Which engines may idle into sleep at all is
  :func:`turnout.core.poolpolicy.may_idle_sleep` (vLLM with sleep mode on a single GPU, as the agent's snapshot
  reports its accelerators; more only with ``lifecycle.sleepByStop``). The driver de-routes first, sleeps,
  and restores the route when the sleep fails (:class:`SleepIdle`).
- KV redistribution (single-GPU pods, ``reclaim.capacityBytes`` set): :func:`turnout.core.poolpolicy.plan_kv`
  over every engine with a kvcached segment (one that is not serving keeps its pages and floor but has no
  demand); limits are only sent when they differ from the engine's current capacity, shrinking ones first so
  the pool never holds more than its capacity in between. Protected pages (used + preallocated) that do not fit
  yield one ``KvPlanUnfit`` event when that starts (not every tick), floors lowered to fit one
  ``KvFloorsScaled`` event when that starts; either may be reported again after a tick without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from turnout.core.poolpolicy import (
    KvDemand,
    KvUnfit,
    PolicyError,
    PoolPolicy,
    may_idle_sleep,
    parse_pool_policy,
    plan_kv,
)

__all__ = [
    "RETRY_AFTER_S",
    "WOKEN_HOLD_S",
    "EngineObservation",
    "PolicyEvent",
    "PoolMemory",
    "PoolStep",
    "SetKvLimit",
    "SleepIdle",
    "pool_step",
]


RETRY_AFTER_S = 10  # the Retry-After of the gateway's 503 for a claimed model asleep or on its way up
WOKEN_HOLD_S = 2.0 * RETRY_AFTER_S  # a woken engine is kept awake this long: a retry, and one more, find it


@dataclass(frozen=True, slots=True)
class EngineObservation:
    claim: str
    model: str
    phase: str
    ready: bool
    kv_used_bytes: int | None = None  # used + preallocated pages
    kv_prealloc_bytes: int = 0
    kv_capacity_bytes: int | None = None
    running: int | None = None
    waiting: int | None = None
    success_total: int | None = None
    in_place_sleep: bool = False  # the engine sleeps in place (vLLM with sleep mode, SGLang), not by stopping
    engine: str = ""  # vllm, sglang or llamacpp as the agent reports it ("" when it does not say)

    @property
    def observable(self) -> bool:
        return self.running is not None and self.waiting is not None and self.success_total is not None

    @property
    def serving(self) -> bool:
        return self.phase == "active" and self.ready


@dataclass(frozen=True, slots=True)
class PoolMemory:
    """What one pod's step remembers for the next: idle runs, completion counters, the reported bad policy."""

    idle_since: Mapping[str, float] = field(default_factory=dict)  # model -> first idle observation of the run
    success: Mapping[str, int] = field(default_factory=dict)  # model -> success_total seen last tick
    reported_invalid: str | None = None  # annotation text already reported as invalid
    kv_unfit: bool = False  # the last KV plan's protected pages did not fit (already reported)
    kv_floors_scaled: bool = False  # the last KV plan lowered the floors to fit (already reported)
    # model -> None while it is seen asleep (or was just put to sleep), then the first time it is seen ready
    # again; dropped once it has been awake for WOKEN_HOLD_S
    woken: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SetKvLimit:
    pod: str
    model: str
    limit_bytes: int


@dataclass(frozen=True, slots=True)
class SleepIdle:
    """De-route the claim, sleep its engine, and restore the route if the sleep fails."""

    pod: str
    claim: str
    model: str
    idle_s: float


@dataclass(frozen=True, slots=True)
class PolicyEvent:
    pod: str
    reason: str
    message: str


PoolAction = SetKvLimit | SleepIdle | PolicyEvent


@dataclass(frozen=True, slots=True)
class PoolStep:
    actions: list[PoolAction]
    memory: PoolMemory
    policy_valid: bool | None  # None: the pool has no policy annotation


def pool_step(
    pod: str,
    gpus: int,
    policy_text: str | None,
    engines: Sequence[EngineObservation],
    memory: PoolMemory,
    now: float,
    *,
    accelerators: int,
) -> PoolStep:
    """One tick for one pod. ``gpus``: the pod's GPUs as placement counts them (KV plans need 1);
    ``accelerators``: how many GPUs the agent's snapshot reports (0 on a CPU pod), which idle sleep goes by."""
    success = {e.model: e.success_total for e in engines if e.success_total is not None}
    if policy_text is None:
        return PoolStep([], PoolMemory(success=success), None)
    try:
        policy = parse_pool_policy(policy_text)
    except PolicyError as exc:
        actions: list[PoolAction] = []
        if memory.reported_invalid != policy_text:
            actions.append(PolicyEvent(pod, "InvalidPoolPolicy", f"pool policy disabled: {exc}"))
        return PoolStep(actions, PoolMemory(success=success, reported_invalid=policy_text), False)
    actions = []
    idle_since = _idle_runs(engines, memory, now)
    woken = _woken(engines, memory, now)
    if policy.sleep_after_s is not None:
        for e in engines:
            since = idle_since.get(e.model)
            if since is None or not may_idle_sleep(policy, e.engine, e.in_place_sleep, accelerators):
                continue
            ready = woken.get(e.model)
            if now - since >= policy.sleep_after_s and (ready is None or now - ready >= WOKEN_HOLD_S):
                actions.append(SleepIdle(pod, e.claim, e.model, now - since))
                idle_since.pop(e.model)
                woken[e.model] = None  # asleep from now: its next ready is a wake
    kv, unfit, scaled = _kv_actions(pod, gpus, policy, engines, memory)
    actions += kv
    kept = PoolMemory(idle_since, success, kv_unfit=unfit, kv_floors_scaled=scaled, woken=woken)
    return PoolStep(actions, kept, True)


def _woken(engines: Sequence[EngineObservation], memory: PoolMemory, now: float) -> dict[str, float | None]:
    """When each engine seen asleep became ready again (None: still asleep, or on its way up), for as long as
    it is held awake."""
    out: dict[str, float | None] = {}
    for e in engines:
        if e.phase == "sleeping":
            out[e.model] = None
        elif e.model in memory.woken:
            ready = memory.woken[e.model]
            if ready is None:
                out[e.model] = now if e.serving else None
            elif now - ready < WOKEN_HOLD_S:
                out[e.model] = ready
    return out


def _idle_runs(engines: Sequence[EngineObservation], memory: PoolMemory, now: float) -> dict[str, float]:
    """Start of the current run of complete idle observations per serving engine."""
    out: dict[str, float] = {}
    for e in engines:
        if not e.serving or not e.observable:
            continue
        previous = memory.success.get(e.model)
        idle = e.running == 0 and e.waiting == 0 and (previous is None or previous == e.success_total)
        if idle:
            out[e.model] = memory.idle_since.get(e.model, now) if previous is not None else now
    return out


def _kv_actions(
    pod: str, gpus: int, policy: PoolPolicy, engines: Sequence[EngineObservation], memory: PoolMemory
) -> tuple[list[PoolAction], bool, bool]:
    """The KV limits to send, whether the protected pages did not fit this tick and whether the floors were
    lowered to fit (both kept in memory: one event a run)."""
    keep: tuple[list[PoolAction], bool, bool] = ([], memory.kv_unfit, memory.kv_floors_scaled)
    if policy.capacity_bytes is None or gpus != 1:
        return [], False, False
    # Every engine holding a segment takes part (a booting or sleeping one keeps its pages and floor, with no
    # demand); any serving engine without one makes KV use unobservable, so no plan.
    placed = [e for e in engines if e.kv_capacity_bytes is not None and e.kv_used_bytes is not None]
    if not placed or any(e.serving and e not in placed for e in engines):
        return keep
    demands = []
    for e in placed:
        previous = memory.success.get(e.model)
        if e.serving:
            delta = None if previous is None or e.success_total is None else max(e.success_total - previous, 0)
            inflight = None if e.running is None or e.waiting is None else e.running + e.waiting
        else:
            delta, inflight = 0, 0
        used = (e.kv_used_bytes or 0) - e.kv_prealloc_bytes
        demands.append(KvDemand(e.model, used, e.kv_prealloc_bytes, inflight, delta))
    try:
        plan = plan_kv(policy.capacity_bytes, demands, policy.floor_percent)
    except KvUnfit as exc:
        return ([] if memory.kv_unfit else [PolicyEvent(pod, "KvPlanUnfit", str(exc))]), True, False
    if plan is None:
        return keep
    out: list[PoolAction] = []
    if plan.floors_scaled is not None and not memory.kv_floors_scaled:
        out.append(PolicyEvent(pod, "KvFloorsScaled", plan.floors_scaled))
    current = {e.model: e.kv_capacity_bytes for e in placed}
    changes = [SetKvLimit(pod, m, limit) for m, limit in plan.limits.items() if current[m] != limit]
    changes.sort(key=lambda a: a.limit_bytes - (current[a.model] or 0))  # shrink before grow
    out += changes
    return out, False, plan.floors_scaled is not None
