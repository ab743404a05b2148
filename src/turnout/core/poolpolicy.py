"""Pool policy (the ``pool.aibrix.ai/policy`` annotation) and the KV capacity plan it drives.

Parsing is strict: an unknown field or a bad value makes the whole policy invalid (the controller then
disables it and raises an ``InvalidPoolPolicy`` event). Which engines idle into sleep is
:func:`may_idle_sleep` (the design's vLLM on one GPU; anything else only with ``lifecycle.sleepByStop``,
Turnout's extension). The KV plan is for single-GPU pods only, in whole pages:

1. no plan when any model's demand is not observable, or when no model was observed active (in flight or
   completed since the last plan): nothing to redistribute by;
2. each model's protected pages are its used + preallocated ones; protected pages that do not fit the capacity
   are the only reason to refuse a plan (:class:`KvUnfit`, which the controller reports);
3. each model's base is max(floor, protected), the floor being ``guaranteedFloorPercent`` of the capacity.
   Floors that do not all fit beside the protected pages (six models at 20 %) are lowered to the highest common
   floor that does, and the plan says so (:attr:`KvPlan.floors_scaled`, which the controller reports);
4. the remainder goes to the active models by demand: bounded in-flight requests plus completions since the
   last plan;
5. round down to whole pages (never below the protected pages) and hand the leftover pages out by largest
   remainder, ties by name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "KvDemand",
    "KvPlan",
    "KvUnfit",
    "PolicyError",
    "PoolPolicy",
    "may_idle_sleep",
    "parse_pool_policy",
    "plan_kv",
]

INFLIGHT_CAP = 64
COMPLETIONS_CAP = 1024


class PolicyError(ValueError):
    """The annotation is not a valid policy; the message is the event text."""


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    capacity_bytes: int | None = None
    floor_percent: float = 0.0
    sleep_after_s: float | None = None
    sleep_by_stop: bool = False  # Turnout's extension: idle sleep beyond vLLM on one GPU (see may_idle_sleep)


def may_idle_sleep(policy: PoolPolicy, engine: str, in_place: bool, accelerators: int) -> bool:
    """Whether idle sleep may put this engine to sleep: the one rule every driver goes by. The design: only
    vLLM with sleep mode (it sleeps in place) on a pod whose agent reports exactly one GPU. Turnout's extension,
    only with ``lifecycle.sleepByStop``: every other engine (SGLang, which sleeps in place too; llama.cpp and vLLM
    without sleep mode, which sleep by stopping; an engine the snapshot does not name) and pods that report no
    GPU (CPU pools). Pods with several GPUs never idle into sleep."""
    if accelerators > 1:
        return False
    return (engine == "vllm" and in_place and accelerators == 1) or policy.sleep_by_stop


def _object(value: object, where: str, allowed: set[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise PolicyError(f"{where} must be an object")
    unknown = set(value) - allowed
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {sorted(unknown)}")
    return value


def parse_pool_policy(text: str) -> PoolPolicy:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PolicyError(f"not valid JSON: {exc}") from None
    top = _object(raw, "policy", {"reclaim", "lifecycle"})
    capacity: int | None = None
    floor = 0.0
    if "reclaim" in top:
        reclaim = _object(top["reclaim"], "reclaim", {"mode", "capacityBytes", "guaranteedFloorPercent"})
        if reclaim.get("mode", "kv-first") != "kv-first":
            raise PolicyError(f'reclaim.mode must be "kv-first", got {reclaim.get("mode")!r}')
        cap = reclaim.get("capacityBytes")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap <= 0):
            raise PolicyError("reclaim.capacityBytes must be a positive integer")
        capacity = cap
        pct = reclaim.get("guaranteedFloorPercent", 0)
        if not isinstance(pct, int | float) or isinstance(pct, bool) or not 0 <= pct <= 100:
            raise PolicyError("reclaim.guaranteedFloorPercent must be a number from 0 to 100")
        floor = float(pct)
    sleep_after: float | None = None
    by_stop = False
    if "lifecycle" in top:
        lifecycle = _object(top["lifecycle"], "lifecycle", {"sleepAfterSeconds", "sleepByStop"})
        s = lifecycle.get("sleepAfterSeconds")
        if s is not None and (not isinstance(s, int | float) or isinstance(s, bool) or s <= 0):
            raise PolicyError("lifecycle.sleepAfterSeconds must be a positive number")
        sleep_after = None if s is None else float(s)
        switch = lifecycle.get("sleepByStop", False)
        if not isinstance(switch, bool):
            raise PolicyError(f"lifecycle.sleepByStop must be true or false, got {switch!r}")
        by_stop = switch
    return PoolPolicy(capacity, floor, sleep_after, by_stop)


@dataclass(frozen=True, slots=True)
class KvDemand:
    model: str
    used_bytes: int
    prealloc_bytes: int
    inflight: int | None  # None: not observable
    completions_delta: int | None


class KvUnfit(ValueError):
    """The protected pages (used + preallocated) alone exceed the capacity: no plan; the message is the event
    text."""


@dataclass(frozen=True, slots=True)
class KvPlan:
    limits: dict[str, int]  # model -> KV limit in bytes, whole pages, summing to at most the capacity
    floor_bytes: int  # the floor each model was guaranteed in this plan
    floors_scaled: str | None = None  # why the floors were lowered to fit (the event text); None: they fitted


def plan_kv(
    capacity: int, models: Sequence[KvDemand], floor_percent: float, page_bytes: int = 2 << 20
) -> KvPlan | None:
    """Per-model KV limits summing to at most ``capacity``; None when there is nothing to plan by (demand not
    observable, or no model active). Raises :class:`KvUnfit` only when the protected pages do not fit; floors
    that do not all fit are lowered to one common floor that does (:attr:`KvPlan.floors_scaled` says so)."""
    if not models or any(m.inflight is None or m.completions_delta is None for m in models):
        return None
    demand = {
        m.model: min(m.inflight or 0, INFLIGHT_CAP) + min(m.completions_delta or 0, COMPLETIONS_CAP) for m in models
    }
    total = sum(demand.values())
    if total == 0:
        return None  # nobody was observed active
    pages_total = capacity // page_bytes
    protected = {m.model: -(-(m.used_bytes + m.prealloc_bytes) // page_bytes) for m in models}  # whole pages
    if sum(protected.values()) > pages_total:
        parts = ", ".join(f"{n} {u * page_bytes}" for n, u in sorted(protected.items()))
        raise KvUnfit(
            f"KV plan skipped: the used + preallocated KV pages ({parts} bytes) sum to"
            f" {sum(protected.values()) * page_bytes} bytes, over reclaim.capacityBytes {capacity}; raise"
            " reclaim.capacityBytes or place fewer models on this pod"
        )
    wanted = pages_total * floor_percent / 100
    floor, scaled = wanted, None
    if sum(max(wanted, u) for u in protected.values()) > pages_total:
        floor = _fitting_floor(pages_total, list(protected.values()), wanted)
        scaled = (
            f"KV floors lowered: reclaim.guaranteedFloorPercent {floor_percent:g} of reclaim.capacityBytes"
            f" {capacity} ({int(wanted * page_bytes)} bytes a model) does not fit {len(protected)} models"
            f" beside their used + preallocated pages; each model's floor is {int(floor * page_bytes)} bytes"
            f" ({100 * floor / pages_total:.1f} %) in this plan. Lower reclaim.guaranteedFloorPercent or raise"
            " reclaim.capacityBytes to keep the whole floor"
        )
    base = {n: max(floor, float(u)) for n, u in protected.items()}
    remainder = max(pages_total - sum(base.values()), 0.0)
    exact = {n: base[n] + remainder * demand[n] / total for n in protected}
    pages = {n: max(int(exact[n]), protected[n]) for n in protected}  # never below the protected pages
    spare = pages_total - sum(pages.values())
    order = sorted(protected, key=lambda n: (-(exact[n] - int(exact[n])), n))
    for name in order[: max(spare, 0)]:
        pages[name] += 1
    return KvPlan({n: pages[n] * page_bytes for n in sorted(pages)}, int(floor * page_bytes), scaled)


def _fitting_floor(total: int, protected: Sequence[int], wanted: float) -> float:
    """The highest common floor f <= ``wanted`` for which sum(max(f, protected)) = ``total``: the models with the
    fewest protected pages are lifted to it (the protected pages fit ``total``, so one exists)."""
    ordered = sorted(protected)
    rest = sum(ordered)  # the protected pages of the models not lifted to the floor
    for k, u in enumerate(ordered, start=1):  # the k smallest are lifted to the floor
        rest -= u
        floor = (total - rest) / k
        if k == len(ordered) or floor <= ordered[k]:
            return min(max(floor, 0.0), wanted)
    return 0.0  # no models
