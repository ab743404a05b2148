"""Routing: which worker should serve this request, or why none can.

Pure decision over a snapshot of the fleet (``WorkerView``) and the current concurrency counts.
The order is fixed and each step has its own failure:

1. drop unhealthy workers, workers that took this model out after its requests failed there, and those
   excluded by the caller after a failed attempt                                    -> NO_HEALTHY, naming
   each worker's reason (``no healthy worker for "m": w1 down (connection refused), w2 down (timeout)``)
2. drop workers whose placement rules block the model                               -> BLOCKED / UNKNOWN_MODEL
3. if some eligible worker's inventory is known to hold the model, keep only those; otherwise keep only
   the workers whose inventory is unknown (never fetched: fails open). A worker whose (last known, possibly
   stale) inventory lacks the model is never picked; when no worker is left            -> NOT_INSTALLED
   Steps 2 and 3 never answer that a model is missing or blocked while a worker dropped in step 1 holds it
   (and its placement allows it there): that is NO_HEALTHY, naming that worker and why (``model "m" is
   installed only on w1, which is down (requests failing: HTTP 500)``). A 404 tells a client not to retry
   and an operator that the model is missing; neither is true of a model whose worker is down.
4. enforce the global, per-model and per-worker concurrency limits                  -> SATURATED
5. score what is left by loaded affinity, load, learned tokens/s, GPU utilisation and
   VRAM pressure; an absent input is neutral (the mean of the known ones), never zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from turnout.core.names import lookup
from turnout.core.placement import PlacementRules, Verdict, resolve_placement

ALLOW_ALL = PlacementRules()  # no rules: every model allowed

__all__ = [
    "Candidate",
    "Capacity",
    "NoRoute",
    "NoRouteReason",
    "Route",
    "WorkerView",
    "installed_name",
    "route",
]

# Weights of the scoring terms. Loaded affinity dominates: a cold load costs seconds, a busy slot less.
W_LOADED = 2.0
W_LOAD = 1.0
W_SPEED = 0.5
W_GPU = 0.5
W_VRAM = 0.5
# Load is in_flight / max_concurrent; a worker with no limit is scored as if it had this many slots.
SOFT_SLOTS = 8


class NoRouteReason(StrEnum):
    NO_WORKERS = "no_workers"
    NO_HEALTHY = "no_healthy_worker"
    BLOCKED = "model_blocked"
    UNKNOWN_MODEL = "model_not_found"
    NOT_INSTALLED = "model_not_installed"
    SATURATED = "saturated"


class WorkerView(NamedTuple):
    """What the router needs to know about one worker, for one request's model. Immutable, and a tuple rather
    than a frozen dataclass: one is built per worker on every request, and a tuple is built in a third of the
    time (``view._replace(...)`` makes a changed copy)."""

    name: str
    healthy: bool
    rules: PlacementRules = ALLOW_ALL
    inventory: frozenset[str] | None = None  # None: never fetched, unknown
    loaded: frozenset[str] = frozenset()
    in_flight: int = 0
    max_concurrent: int | None = None
    tokens_per_s: float | None = None  # learned for this model on this worker
    gpu_util: float | None = None  # 0..1
    vram_pressure: float | None = None  # 0..1, share of resident model bytes not in VRAM
    down_reason: str | None = None  # why an unhealthy worker is down (``connection refused``), when known
    model_out: str | None = None  # why this model is out on this (healthy) worker (``requests failing: HTTP 500``)


class Capacity(NamedTuple):  # built on every request: a tuple, like WorkerView
    """Gateway-wide counters and limits that apply before any worker is chosen."""

    global_in_flight: int = 0
    global_max: int | None = None
    model_in_flight: int = 0
    model_max: int | None = None


NO_LIMITS = Capacity()  # nothing counted, nothing capped: route()'s default


class Candidate(NamedTuple):  # one per eligible worker on every request: a tuple, like WorkerView
    worker: str
    model: str  # the name to send upstream (e.g. ``gemma4:latest`` for a request for ``gemma4``)
    score: float


@dataclass(frozen=True, slots=True)
class Route:
    candidates: tuple[Candidate, ...]  # best first; the rest are failover options

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


@dataclass(frozen=True, slots=True)
class NoRoute:
    reason: NoRouteReason
    message: str


def installed_name(model: str, inventory: frozenset[str] | None) -> str | None:
    """The inventory entry serving ``model``: the same name, or its other spelling (``gemma4`` <->
    ``gemma4:latest``, Ollama's default tag). None when absent or when the inventory is unknown."""
    return lookup(model, inventory)


def route(
    model: str,
    workers: Sequence[WorkerView],
    capacity: Capacity = NO_LIMITS,
    *,
    exclude: frozenset[str] = frozenset(),
    rotation: int = 0,
) -> Route | NoRoute:
    """Choose workers for ``model``. ``rotation`` breaks score ties round-robin (the caller advances it)."""
    if not workers:
        return NoRoute(NoRouteReason.NO_WORKERS, 'no workers are configured; add one under "workers" in the config')

    healthy = [w for w in workers if w.healthy and w.model_out is None and w.name not in exclude]
    if not healthy:
        down = ", ".join(_why_down(w, exclude) for w in workers)
        return NoRoute(NoRouteReason.NO_HEALTHY, f'no healthy worker for "{model}": {down}')

    eligible: list[tuple[WorkerView, str]] = []
    holding: list[tuple[WorkerView, str]] = []  # the eligible whose inventory holds the model
    refusals: list[str] = []
    for worker in healthy:
        installed = installed_name(model, worker.inventory)
        name = installed or model
        verdict = resolve_placement(worker.rules, name)
        if verdict.allowed:
            eligible.append((worker, name))
            if installed is not None:
                holding.append((worker, name))
        else:
            refusals.append(f"{worker.name}: {_why_blocked(verdict)}")
    if not eligible:
        held = _held_by_dropped(model, workers, len(healthy), exclude)
        if held is not None:
            return held
        if _known_nowhere(model, workers):
            return _unknown_model(model)
        return NoRoute(
            NoRouteReason.BLOCKED,
            f'model "{model}" is blocked by placement on every healthy worker ({"; ".join(refusals)})',
        )

    if holding:
        eligible = holding
    else:
        eligible = [(w, n) for w, n in eligible if w.inventory is None]  # unknown inventory fails open
        if not eligible:
            held = _held_by_dropped(model, workers, len(healthy), exclude)
            if held is not None:
                return held
            if _known_nowhere(model, workers):
                return _unknown_model(model)
            return NoRoute(NoRouteReason.NOT_INSTALLED, _not_installed(model))

    if capacity.global_max is not None and capacity.global_in_flight >= capacity.global_max:
        return NoRoute(
            NoRouteReason.SATURATED,
            f"the gateway is at its limit of {capacity.global_max} concurrent requests",
        )
    if capacity.model_max is not None and capacity.model_in_flight >= capacity.model_max:
        return NoRoute(
            NoRouteReason.SATURATED,
            f'model "{model}" is at its limit of {capacity.model_max} concurrent requests',
        )
    free = [(w, n) for w, n in eligible if w.max_concurrent is None or w.in_flight < w.max_concurrent]
    if not free:
        busy = ", ".join(w.name for w, _ in eligible)
        return NoRoute(NoRouteReason.SATURATED, f'every worker for model "{model}" is busy ({busy})')

    return Route(_rank(free, rotation))


def _why_down(worker: WorkerView, exclude: frozenset[str]) -> str:
    """``w1 down (connection refused)``, ``w1 down for this model (requests failing: HTTP 500)``, or a
    worker excluded after failing this request."""
    return f"{worker.name} {_down(worker, exclude)}"


def _down(worker: WorkerView, exclude: frozenset[str]) -> str:
    if not worker.healthy:
        return f"down ({worker.down_reason})" if worker.down_reason else "down"
    if worker.model_out is not None:
        return f"down for this model ({worker.model_out})"
    return "failed for this request" if worker.name in exclude else "up"


def _held_by_dropped(model: str, workers: Sequence[WorkerView], usable: int, exclude: frozenset[str]) -> NoRoute | None:
    """NO_HEALTHY when workers dropped in step 1 are known to hold ``model`` and may serve it (placement),
    naming them and why; None when there are none (the model is missing or blocked, as the caller says)."""
    if usable == len(workers):
        return None  # nothing was dropped: the common case, answered without a second walk
    holders = []
    for worker in workers:
        if worker.healthy and worker.model_out is None and worker.name not in exclude:
            continue
        installed = installed_name(model, worker.inventory)
        if installed is not None and resolve_placement(worker.rules, installed).allowed:
            holders.append(worker)
    if not holders:
        return None
    if len(holders) == 1:
        where = f"{holders[0].name}, which is down ({_cause(holders[0], exclude)})"
    else:
        names = f"{', '.join(w.name for w in holders[:-1])} and {holders[-1].name}"
        where = f"{names}, which are down ({'; '.join(f'{w.name}: {_cause(w, exclude)}' for w in holders)})"
    return NoRoute(NoRouteReason.NO_HEALTHY, f'model "{model}" is installed only on {where}')


def _cause(worker: WorkerView, exclude: frozenset[str]) -> str:
    """Why a dropped worker cannot serve: its down reason, why the model is out there, or this request's
    failure. A model out on its worker reads as down, as a client sees it."""
    if not worker.healthy:
        return worker.down_reason or "not answering"
    if worker.model_out is not None:
        return worker.model_out
    return "failed for this request" if worker.name in exclude else "unknown"


def _why_blocked(verdict: Verdict) -> str:
    if verdict.rule == "mode":
        return "not in its whitelist"
    return f'denied by rule "{verdict.rule}"'


def _known_nowhere(model: str, workers: Sequence[WorkerView]) -> bool:
    """True when every worker's inventory is known and none holds the model."""
    return all(w.inventory is not None and installed_name(model, w.inventory) is None for w in workers)


def _not_installed(model: str) -> str:
    return f'model "{model}" is not installed on any eligible worker'


def _unknown_model(model: str) -> NoRoute:
    """Known nowhere in the fleet: the design's wording, with its own code (404) for clients that branch on it."""
    return NoRoute(NoRouteReason.UNKNOWN_MODEL, _not_installed(model))


def _rank(free: list[tuple[WorkerView, str]], rotation: int) -> tuple[Candidate, ...]:
    if len(free) == 1:  # nothing to compare: skip scoring (the common single-worker-per-model case)
        worker, name = free[0]
        return (Candidate(worker.name, name, 0.0),)
    speeds = _normalised([w.tokens_per_s for w, _ in free])
    gpu = _neutral([w.gpu_util for w, _ in free])
    vram = _neutral([w.vram_pressure for w, _ in free])
    scored: list[tuple[float, int, Candidate]] = []
    n = len(free)
    for index, (worker, name) in enumerate(free):
        slots = worker.max_concurrent or SOFT_SLOTS
        score = (
            W_LOADED * (name in worker.loaded)
            - W_LOAD * (worker.in_flight / slots)
            + W_SPEED * speeds[index]
            - W_GPU * gpu[index]
            - W_VRAM * vram[index]
        )
        scored.append((score, (index - rotation) % n, Candidate(worker.name, name, round(score, 6))))
    scored.sort(key=lambda item: (-item[0], item[1]))
    return tuple(c for _, _, c in scored)


def _neutral(values: list[float | None]) -> list[float]:
    """Absent values become the mean of the known ones (0 when none is known): no bonus, no penalty."""
    known = [v for v in values if v is not None]
    mean = sum(known) / len(known) if known else 0.0
    return [mean if v is None else v for v in values]


def _normalised(values: list[float | None]) -> list[float]:
    """Scale to 0..1 by the fastest known value, then fill absent ones with the mean."""
    peak = max((v for v in values if v is not None and v > 0), default=None)
    if peak is None:
        return [0.0] * len(values)
    return _neutral([None if v is None else max(v, 0.0) / peak for v in values])
