"""Pool policy (the ``pool.aibrix.ai/policy`` annotation) and the KV capacity plan it drives.

Parsing is strict: an unknown field or a bad value makes the whole policy invalid (the controller then
disables it and raises an ``InvalidPoolPolicy`` event). The KV plan is for single-GPU pods only:

1. protect each model's used + preallocated pages; no plan if they exceed the capacity;
2. raise each model to its floor (``guaranteedFloorPercent`` of the capacity), scaled down if floors do not fit;
3. share the remainder by demand: bounded in-flight requests plus completions since the last plan; no plan when
   any model's demand is not observable; an even split when nobody asks;
4. round down to whole pages and hand the leftover pages out by largest remainder, ties by name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KvDemand", "PolicyError", "PoolPolicy", "parse_pool_policy", "plan_kv"]

INFLIGHT_CAP = 64
COMPLETIONS_CAP = 1024


class PolicyError(ValueError):
    """The annotation is not a valid policy; the message is the event text."""


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    capacity_bytes: int | None = None
    floor_percent: float = 0.0
    sleep_after_s: float | None = None


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
    if "lifecycle" in top:
        lifecycle = _object(top["lifecycle"], "lifecycle", {"sleepAfterSeconds"})
        s = lifecycle.get("sleepAfterSeconds")
        if s is not None and (not isinstance(s, int | float) or isinstance(s, bool) or s <= 0):
            raise PolicyError("lifecycle.sleepAfterSeconds must be a positive number")
        sleep_after = None if s is None else float(s)
    return PoolPolicy(capacity, floor, sleep_after)


@dataclass(frozen=True, slots=True)
class KvDemand:
    model: str
    used_bytes: int
    prealloc_bytes: int
    inflight: int | None  # None: not observable
    completions_delta: int | None


def plan_kv(
    capacity: int, models: Sequence[KvDemand], floor_percent: float, page_bytes: int = 2 << 20
) -> dict[str, int] | None:
    """Per-model KV limits summing to at most ``capacity``, or None when no safe plan exists."""
    if not models:
        return {}
    if any(m.inflight is None or m.completions_delta is None for m in models):
        return None
    protected = {m.model: m.used_bytes + m.prealloc_bytes for m in models}
    if sum(protected.values()) > capacity:
        return None
    floor = capacity * floor_percent / 100
    want = {n: max(floor - p, 0.0) for n, p in protected.items()}
    room = capacity - sum(protected.values())
    scale = min(1.0, room / sum(want.values())) if sum(want.values()) > 0 else 0.0
    base = {n: protected[n] + want[n] * scale for n in protected}
    remainder = capacity - sum(base.values())
    demand = {
        m.model: min(m.inflight or 0, INFLIGHT_CAP) + min(m.completions_delta or 0, COMPLETIONS_CAP) for m in models
    }
    total = sum(demand.values())
    share = {n: remainder * (demand[n] / total if total else 1 / len(models)) for n in protected}
    exact = {n: base[n] + share[n] for n in protected}
    pages = {n: max(int(exact[n] // page_bytes), -(-protected[n] // page_bytes)) for n in protected}
    spare = capacity // page_bytes - sum(pages.values())
    order = sorted(protected, key=lambda n: (-(exact[n] / page_bytes - int(exact[n] // page_bytes)), n))
    for name in order:
        if spare <= 0:
            break
        pages[name] += 1
        spare -= 1
    if spare < 0:
        return None  # rounding protected pages up does not fit
    return {n: pages[n] * page_bytes for n in sorted(pages)}
