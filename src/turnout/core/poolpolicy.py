"""Pool policy (the ``pool.aibrix.ai/policy`` annotation) and the KV capacity plan it drives.

Parsing is strict: an unknown field or a bad value makes the whole policy invalid (the controller then
disables it and raises an ``InvalidPoolPolicy`` event). ``lifecycle.sleepByStop`` is Turnout's extension to the
design's idle sleep (see :func:`may_idle_sleep`). The KV plan is for single-GPU pods only:

1. no plan when any model's demand is not observable, or when no model was observed active (in flight or
   completed since the last plan): nothing to redistribute by;
2. each model's base is max(floor, used + preallocated), the floor being ``guaranteedFloorPercent`` of the
   capacity; bases that do not fit the capacity mean no plan (:class:`KvUnfit`, which the controller reports),
   never silently scaled floors;
3. the remainder goes to the active models by demand: bounded in-flight requests plus completions since the
   last plan;
4. round down to whole pages (never below the used pages) and hand the leftover pages out by largest
   remainder, ties by name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KvDemand", "KvUnfit", "PolicyError", "PoolPolicy", "may_idle_sleep", "parse_pool_policy", "plan_kv"]

INFLIGHT_CAP = 64
COMPLETIONS_CAP = 1024


class PolicyError(ValueError):
    """The annotation is not a valid policy; the message is the event text."""


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    capacity_bytes: int | None = None
    floor_percent: float = 0.0
    sleep_after_s: float | None = None
    sleep_by_stop: bool = False  # Turnout's extension: idle sleep also by stopping, and on CPU pods


def may_idle_sleep(policy: PoolPolicy, in_place: bool, accelerators: int) -> bool:
    """Whether idle sleep may put this engine to sleep. The design: only an engine that sleeps in place (vLLM
    with sleep mode, SGLang) on a pod whose agent reports exactly one GPU. Turnout's extension, only with
    ``lifecycle.sleepByStop``: engines that sleep by stopping (llama.cpp, vLLM without sleep mode) and pods
    that report no GPU (CPU pools). Pods with several GPUs never idle into sleep."""
    if accelerators > 1:
        return False
    return (in_place and accelerators == 1) or policy.sleep_by_stop


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
    """The bases (max(floor, used + preallocated)) exceed the capacity: no plan; the message is the event text."""


def plan_kv(
    capacity: int, models: Sequence[KvDemand], floor_percent: float, page_bytes: int = 2 << 20
) -> dict[str, int] | None:
    """Per-model KV limits summing to at most ``capacity``; None when there is nothing to plan by (demand not
    observable, or no model active). Raises :class:`KvUnfit` when the bases do not fit."""
    if not models or any(m.inflight is None or m.completions_delta is None for m in models):
        return None
    demand = {
        m.model: min(m.inflight or 0, INFLIGHT_CAP) + min(m.completions_delta or 0, COMPLETIONS_CAP) for m in models
    }
    total = sum(demand.values())
    if total == 0:
        return None  # nobody was observed active
    used = {m.model: m.used_bytes + m.prealloc_bytes for m in models}
    floor = capacity * floor_percent / 100
    base = {n: max(floor, u) for n, u in used.items()}
    if sum(base.values()) > capacity:
        parts = ", ".join(f"{n} {int(b)}" for n, b in sorted(base.items()))
        raise KvUnfit(
            f"KV plan skipped: the bases max(floor, used + preallocated) ({parts}) sum to {int(sum(base.values()))}"
            f" bytes, over reclaim.capacityBytes {capacity}; lower reclaim.guaranteedFloorPercent or raise"
            " reclaim.capacityBytes"
        )
    remainder = capacity - sum(base.values())
    exact = {n: base[n] + remainder * demand[n] / total for n in used}
    pages = {n: max(int(exact[n] // page_bytes), -(-used[n] // page_bytes)) for n in used}
    spare = capacity // page_bytes - sum(pages.values())
    order = sorted(used, key=lambda n: (-(exact[n] / page_bytes - int(exact[n] // page_bytes)), n))
    for name in order:
        if spare <= 0:
            break
        pages[name] += 1
        spare -= 1
    if spare < 0:
        return None  # rounding used pages up to whole pages does not fit
    return {n: pages[n] * page_bytes for n in sorted(pages)}
