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
   Steps 2 and 3 never answer that a model is missing or blocked while a worker dropped in step 1 holds it, or
   may hold it (its inventory never fetched: unknown, not empty), and its placement allows it there: that is
   NO_HEALTHY, naming that worker and why (``model "m" is
   installed only on w1, which is down (requests failing: HTTP 500)``). A 404 tells a client not to retry
   and an operator that the model is missing; neither is true of a model whose worker is down.
4. enforce the global, per-model and per-worker concurrency limits                  -> SATURATED
5. rank what is left by the time each would take to answer (:func:`expected_seconds`), the least first:
   the wait in its engine's own queue when every one of its slots is busy (what its requests in flight still have
   to do: their expected work, each estimated when it was ranked, less what its slots have done since the oldest
   of them was sent; a request without an estimate counts as long as a request holds the worker, learned; worked
   through at the engine's throughput, and then its own work beside the rest), on an engine with a free slot and
   requests at work the part of their work that overlaps its own (what an engine runs at once shares its speed:
   :mod:`turnout.core.sharing`, learned, or shared until learned), the prefill of the part of the prompt it is not
   expected to hold in its KV cache (``WorkerView.cached``: from the prefix index or the client's session, at its
   learned prefill rate), the decode
   (at its learned decode rate), the whole work slowed by GPU utilisation and VRAM pressure, a cold load where the
   model is known not to be loaded, and, on an engine whose slots all hold prompts that still count, half the
   prefill of the one this request would push out (so that a new conversation goes to a worker with a free or
   stale slot rather than evicting another conversation's prefix). An absent input is neutral (the mean of the
   known ones), never zero; ties rotate round-robin. Slots are what the engine runs at once
   (:mod:`turnout.core.parallelism`: declared, read from the engine, learned, or one until there is evidence);
   ``None`` is a batching engine of unknown capacity, taken to run :data:`SOFT_SLOTS` at once.
6. work-conserving: a candidate that would wait in its engine's queue goes before one with a free slot only when
   its own expected time, that wait included, is shorter (the prefix it holds outweighs the wait); the cost of
   pushing another conversation's prompt out never leaves a free engine idle while requests queue elsewhere.
7. the load guard: when the worker ranked first has far more requests in flight than the least loaded one
   (more than ``LoadGuard.absolute`` more, and more than ``LoadGuard.relative`` times as many, as SGLang's
   router checks), rank by load instead, so that a hot prefix spreads over several workers rather than
   queueing on the one that holds it (the prefix index then learns the new placement). Unless configured, the
   absolute threshold is the first worker's slots (a whole engine's worth of requests waiting beyond what it
   runs at once: 1 for a one-slot engine), or :data:`BATCH_GUARD` for a batching engine of unknown capacity.

Learned rates are noisy (one answer that shared the machine with others, one that waited in an engine's own
queue) and a worker judged slow by one of them would never be sent another to correct it. So a rate counts by
how many answers taught it: each candidate's is drawn towards the candidates' mean as if :data:`PRIOR_SAMPLES`
answers had taught the mean (:func:`credible_rate`); a worker that is really slower stays slower once a few
answers say so.

The decision says why (:attr:`Route.why`): ``prefix 0.83`` (the first holds the largest share of the prompt,
0.83 of it), ``session`` (it holds the client's session), ``history 0.70`` (the quickest holds none of it, no
candidate but the first holds any, and the first was sent 0.70 of it recently: see :data:`HISTORY_SLACK`; only
candidates with a free slot, where any has one), ``free slot`` (step 6 put it first), ``load guard``, ``least
expected time`` (no held prefix decided it), or ``only candidate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from turnout.core.names import lookup
from turnout.core.placement import PlacementRules, Verdict, resolve_placement
from turnout.core.prefix import BYTES_PER_TOKEN
from turnout.core.sharing import ASSUMED as ASSUMED_SHARING
from turnout.core.sharing import MAX_SHARING, overlap, throughput

ALLOW_ALL = PlacementRules()  # no rules: every model allowed

__all__ = [
    "DEFAULT_GUARD",
    "NO_BACKLOG",
    "Backlog",
    "Candidate",
    "Capacity",
    "Demand",
    "Expected",
    "LoadGuard",
    "Neutral",
    "NoRoute",
    "NoRouteReason",
    "Reason",
    "Route",
    "WorkerView",
    "credible_rate",
    "expected_seconds",
    "installed_name",
    "neutral_of",
    "route",
]

# GPU utilisation and VRAM pressure (0..1) slow the work down by this much each, at most.
W_GPU = 0.5
W_VRAM = 0.5
# A worker whose residency is known and lacks the model first loads it: assumed to take this long.
LOAD_S = 5.0
# A batching engine of unknown capacity (vLLM, SGLang before their queue showed it) is taken to run this many at once.
SOFT_SLOTS = 8
# What is ahead in a busy engine's queue is taken to shrink as its slots work through it since the oldest of it was
# sent, but never below this share of it (an answer running longer than expected has some left all the same).
LEFT_FLOOR = 0.2
# Pushing a held prompt out of an engine's slot costs its prefill again if its conversation comes back: counted
# at this share of that prefill (it may not come back).
W_EVICT = 0.5
# ... and the less the longer ago it was sent (a conversation that has not come back for a while is less likely to
# come back soon): halved for every this many seconds. So a new conversation takes the slot of the prompt sent
# longest ago, as llama.cpp's server itself picks the least recently used slot.
EVICT_HALF_LIFE_S = 60.0
# Where the quickest candidate holds none of the prompt and no other holds any (but the one chosen here), one that
# was sent its beginning recently (its slot since reused, or holding part of it) is preferred when it is expected to
# take at most this share longer than the quickest: conversation groups keep to the engines they were on, so each
# engine's slots keep holding their groups' prefixes instead of every group pushing every other out of every
# engine. Where another candidate holds part of the prompt (a sibling conversation's system prompt on a busy
# engine), the expected time decides: sending it back to where it was, within the slack, would push out a prompt
# that engine still holds for nothing (measured: spread reused 39 % against 47 % with that, bench/README.md).
HISTORY_SLACK = 0.25
# A learned rate counts as if this many answers at the candidates' mean rate had been folded in with it.
PRIOR_SAMPLES = 4.0
# The load guard's absolute threshold for a batching engine (no slots), unless configured.
BATCH_GUARD = 4 * SOFT_SLOTS
# Rates assumed while no candidate has a fresh learned one (their ratio to each other is what matters): prefill
# ten times decode, between a GPU's (a hundred times) and a CPU's llama.cpp (two to five times), so that a held
# prefix counts for something before the first cold answer has taught the real rate.
DEFAULT_PREFILL = 300.0  # prompt tokens/s
DEFAULT_DECODE = 30.0  # completion tokens/s
DEFAULT_OUTPUT_TOKENS = 64.0  # completion length assumed for a model none has been learned for


class NoRouteReason(StrEnum):
    NO_WORKERS = "no_workers"
    NO_HEALTHY = "no_healthy_worker"
    BLOCKED = "model_blocked"
    UNKNOWN_MODEL = "model_not_found"
    NOT_INSTALLED = "model_not_installed"
    SATURATED = "saturated"


class Backlog(NamedTuple):
    """What a worker's requests in flight are expected to take, every replica's (:class:`WorkerView`'s
    ``backlog_s``, ``ranked`` and ``busy_s``): the work of those ranked there, each as expected when it was
    ranked, how many that is, and how long ago the oldest of all was sent."""

    work_s: float
    ranked: int
    busy_s: float


NO_BACKLOG = Backlog(0.0, 0, 0.0)


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
    gpu_util: float | None = None  # 0..1
    vram_pressure: float | None = None  # 0..1, share of resident model bytes not in VRAM
    down_reason: str | None = None  # why an unhealthy worker is down (``connection refused``), when known
    model_out: str | None = None  # why this model is out on this (healthy) worker (``requests failing: HTTP 500``)
    slots: int | None = None  # requests its engine runs at once (:mod:`turnout.core.parallelism`); None: batching
    busy_s: float = 0.0  # seconds since the oldest of its requests in flight was sent (0 when none)
    prefill_rate: float | None = None  # learned for this model here, uncached prompt tokens/s; None: unknown/stale
    decode_rate: float | None = None  # learned, completion tokens/s after the first
    prefill_samples: int = 1  # how many answers taught prefill_rate (since it was last forgotten)
    decode_samples: int = 1  # ... and decode_rate
    service_s: float | None = None  # learned, how long a request holds it
    backlog_s: float = 0.0  # the expected work of its requests in flight that were ranked here (each its own)
    ranked: int = 0  # how many of its requests in flight that is (the others count service_s each)
    cached: int = 0  # bytes of this request's prompt it is expected to hold in its KV cache
    by_session: bool = False  # ``cached`` is what the client's session sent here last (not the prefix index)
    evicts: int = 0  # bytes of a held prompt this one would push out of its slots (an engine with slots)
    evicts_age_s: float = 0.0  # how long ago that prompt was sent there
    history: int = 0  # bytes of this request's prompt sent here recently, whether or not a slot still holds them
    sharing: float | None = None  # learned: how much what its engine runs at once slows each (turnout.core.sharing)


class Capacity(NamedTuple):  # built on every request: a tuple, like WorkerView
    """Gateway-wide counters and limits that apply before any worker is chosen."""

    global_in_flight: int = 0
    global_max: int | None = None
    model_in_flight: int = 0
    model_max: int | None = None


NO_LIMITS = Capacity()  # nothing counted, nothing capped: route()'s default


class Demand(NamedTuple):
    """What the request asks of a worker: its prompt (bytes, the prefix index's unit) and its answer's length."""

    prompt_bytes: int = 0
    output_tokens: float = DEFAULT_OUTPUT_TOKENS


NO_DEMAND = Demand()


class LoadGuard(NamedTuple):
    """When the worker ranked first is this far above the least loaded one (in requests in flight, both
    thresholds exceeded), rank by load instead. ``absolute`` None: the first worker's slots, or
    :data:`BATCH_GUARD` for a batching engine."""

    absolute: int | None = None
    relative: float = 1.5


DEFAULT_GUARD = LoadGuard()


class Reason(StrEnum):
    """Why the first candidate is first."""

    PREFIX = "prefix"
    SESSION = "session"
    HISTORY = "history"
    LOAD_GUARD = "load guard"
    FREE_SLOT = "free slot"
    LEAST_TIME = "least expected time"
    ONLY = "only candidate"


class Candidate(NamedTuple):  # one per eligible worker on every request: a tuple, like WorkerView
    worker: str
    model: str  # the name to send upstream (e.g. ``gemma4:latest`` for a request for ``gemma4``)
    score: float  # minus the expected seconds: higher is better
    cached: int = 0  # bytes of the prompt it was expected to hold
    work: float = 0.0  # of those seconds, its own work there (prefill, decode, a load): what it adds to the backlog


@dataclass(frozen=True, slots=True)
class Route:
    candidates: tuple[Candidate, ...]  # best first; the rest are failover options
    reason: Reason = Reason.ONLY
    share: float = 0.0  # the share of the prompt the first is expected to hold (0..1)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def why(self) -> str:
        """``prefix 0.83``, ``session``, ``load guard``, ``least expected time`` or ``only candidate``."""
        if self.reason is Reason.PREFIX or self.reason is Reason.HISTORY:
            return f"{self.reason.value} {self.share:.2f}"
        return self.reason.value


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
    demand: Demand = NO_DEMAND,
    guard: LoadGuard = DEFAULT_GUARD,
    served_elsewhere: bool = False,
) -> Route | NoRoute:
    """Choose workers for ``model``. ``rotation`` breaks ties round-robin (the caller advances it); ``demand``:
    the request's prompt and answer; ``guard``: the load guard's thresholds. ``served_elsewhere``: the gateway
    serves models, but none of the workers that serve un-namespaced names (its claims and endpoints do): with no
    ``workers``, an unknown model rather than an empty fleet."""
    if not workers:
        if served_elsewhere:
            return _unknown_model(model)
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

    return _rank(free, rotation, demand, guard, compared=len(workers) > 1)


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
    """NO_HEALTHY when workers dropped in step 1 may serve ``model``: known to hold it, or never listed (a worker
    whose inventory was never fetched is unknown, not empty: after a restart with a box switched off, its models
    are its own), and allowed by placement; naming them and why. None when there are none (the model is missing or
    blocked, as the caller says)."""
    if usable == len(workers):
        return None  # nothing was dropped: the common case, answered without a second walk
    holders, unknown = [], []
    for worker in workers:
        if worker.healthy and worker.model_out is None and worker.name not in exclude:
            continue
        if worker.inventory is None:
            if resolve_placement(worker.rules, model).allowed:
                unknown.append(worker)
            continue
        installed = installed_name(model, worker.inventory)
        if installed is not None and resolve_placement(worker.rules, installed).allowed:
            holders.append(worker)
    if holders:
        if len(holders) == 1:
            where = f"{holders[0].name}, which is down ({_cause(holders[0], exclude)})"
        else:
            names = f"{', '.join(w.name for w in holders[:-1])} and {holders[-1].name}"
            where = f"{names}, which are down ({'; '.join(f'{w.name}: {_cause(w, exclude)}' for w in holders)})"
        return NoRoute(NoRouteReason.NO_HEALTHY, f'model "{model}" is installed only on {where}')
    if unknown:
        which = "; ".join(f"{w.name}: {_cause(w, exclude)}" for w in unknown)
        return NoRoute(
            NoRouteReason.NO_HEALTHY,
            f'model "{model}" is not installed on any healthy worker, and {_names(unknown)} '
            f"{'is' if len(unknown) == 1 else 'are'} down with models not known yet (never listed): {which}",
        )
    return None


def _names(workers: Sequence[WorkerView]) -> str:
    if len(workers) == 1:
        return workers[0].name
    return f"{', '.join(w.name for w in workers[:-1])} and {workers[-1].name}"


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


class Neutral(NamedTuple):
    """What a candidate without its own value takes: the mean of the candidates' known values."""

    prefill: float
    decode: float
    service: float | None
    gpu: float
    vram: float
    sharing: float = ASSUMED_SHARING


def neutral_of(views: Sequence[WorkerView]) -> Neutral:
    """What a candidate without its own figure takes: the mean of the candidates' known ones."""
    return Neutral(
        _mean([w.prefill_rate for w in views]) or DEFAULT_PREFILL,
        _mean([w.decode_rate for w in views]) or DEFAULT_DECODE,
        _mean([w.service_s for w in views]),
        _mean([w.gpu_util for w in views]) or 0.0,
        _mean([w.vram_pressure for w in views]) or 0.0,
        _known_or([w.sharing for w in views if w.slots is not None and w.slots > 1], ASSUMED_SHARING),
    )


def credible_rate(rate: float | None, samples: int, mean: float) -> float:
    """A learned ``rate`` drawn towards the candidates' ``mean`` as if :data:`PRIOR_SAMPLES` answers had taught
    the mean (a harmonic blend: the times per token are averaged, as the router adds times); ``mean`` where
    none is learned."""
    if not rate:
        return mean
    n = max(samples, 1)
    return mean * (n + PRIOR_SAMPLES) / (n * mean / rate + PRIOR_SAMPLES)  # exactly ``mean`` at the mean


class Expected(NamedTuple):
    """How long a worker is expected to take to answer one request (:func:`expected_seconds`)."""

    seconds: float  # what ranks it: ``own`` and the cost of a held prompt it would push out
    own: float  # this request's own time there: the wait in the engine's queue and its work
    work: float  # of which its work there (prefill, decode, a load): what it adds to the backlog
    queued: bool  # every slot busy: it would wait in the engine's own queue


def expected_seconds(view: WorkerView, name: str, demand: Demand, neutral: Neutral) -> Expected:
    """How long ``view``'s worker would take to answer ``demand``: see the module's docstring, step 5."""
    prefill = credible_rate(view.prefill_rate, view.prefill_samples, neutral.prefill)
    decode = credible_rate(view.decode_rate, view.decode_samples, neutral.decode)
    uncached = max(demand.prompt_bytes - view.cached, 0) / BYTES_PER_TOKEN
    slowdown = 1.0 + W_GPU * (neutral.gpu if view.gpu_util is None else view.gpu_util)
    slowdown += W_VRAM * (neutral.vram if view.vram_pressure is None else view.vram_pressure)
    decoding = demand.output_tokens / decode * slowdown
    work = computed = uncached / prefill * slowdown + decoding  # (what sharing the engine slows: not a load)
    cold = demand.prompt_bytes / BYTES_PER_TOKEN / prefill * slowdown + decoding  # this request, nothing held
    if name not in view.loaded:
        work += LOAD_S
    own = work
    slots = view.slots
    queued = slots is not None and view.in_flight >= slots
    if view.in_flight:
        # what is ahead: the expected work of the requests in flight there (each estimated when it was ranked),
        # those without an estimate at the time a request holds it (unknown: as long as this one would take cold)
        service = view.service_s or neutral.service or cold
        pending = view.backlog_s + max(view.in_flight - view.ranked, 0) * service
        if slots is None:
            own += pending / SOFT_SLOTS
        elif queued or slots > 1:
            # what they have left, at the speed the engine runs them together (:mod:`turnout.core.sharing`)
            sharing = min(max(neutral.sharing if view.sharing is None else view.sharing, 0.0), MAX_SHARING)
            done = throughput(min(view.in_flight, slots), sharing) * view.busy_s
            left = max(pending - done, LEFT_FLOOR * pending)
            if queued:  # every slot busy: it waits in the engine's queue for one to free, then runs beside the rest
                own += left / throughput(slots, sharing) + sharing * (slots - 1) * computed
            else:  # a free slot beside requests at work: it shares the engine's speed with them
                own += overlap(sharing, left, view.in_flight, computed)
    seconds = own
    if view.evicts > view.cached:  # a held prompt pushed out: its prefill again, if its conversation comes back
        weight = W_EVICT * 0.5 ** (max(view.evicts_age_s, 0.0) / EVICT_HALF_LIFE_S)
        seconds += weight * (view.evicts - view.cached) / BYTES_PER_TOKEN / prefill
    return Expected(seconds, own, work, queued)


class _Scored(NamedTuple):
    expected: Expected
    turn: int  # its place in this request's round-robin turn (ties)
    in_flight: int
    by_session: bool
    candidate: Candidate

    @property
    def free(self) -> bool:
        return not self.expected.queued


def _rank(
    free: list[tuple[WorkerView, str]], rotation: int, demand: Demand, guard: LoadGuard, *, compared: bool = False
) -> Route:
    if len(free) == 1:  # nothing to compare: skip scoring (the common single-worker-per-model case)
        worker, name = free[0]
        # ``compared``: the others are full or out only now, and the work it adds to this one's backlog ranks their
        # next requests (0 had said its engine would be free at once: they queued there behind it)
        work = expected_seconds(worker, name, demand, neutral_of([worker])).work if compared else 0.0
        return Route((Candidate(worker.name, name, 0.0, worker.cached, work),))
    neutral = neutral_of([w for w, _ in free])
    n = len(free)
    scored: list[_Scored] = []
    for index, (worker, name) in enumerate(free):
        expected = expected_seconds(worker, name, demand, neutral)
        candidate = Candidate(worker.name, name, -round(expected.seconds, 6), worker.cached, expected.work)
        scored.append(_Scored(expected, (index - rotation) % n, worker.in_flight, worker.by_session, candidate))
    scored.sort(key=lambda item: (item.expected.seconds, item.turn))
    promoted = _conserve_work(scored)
    first = scored[0]
    least = min(item.in_flight for item in scored)
    absolute = guard.absolute
    if absolute is None:
        slots = next(w.slots for w, _ in free if w.name == first.candidate.worker)
        absolute = BATCH_GUARD if slots is None else slots
    if first.in_flight - least > absolute and first.in_flight > guard.relative * least:
        scored.sort(key=lambda item: item.in_flight)  # stable: at equal load, the expected time's order
        return Route(tuple(item.candidate for item in scored), Reason.LOAD_GUARD)
    ranked = tuple(item.candidate for item in scored)
    best = ranked[0]
    returning = _returning(scored, free, demand)
    if returning is not None:
        return returning
    if promoted:
        return Route(ranked, Reason.FREE_SLOT)
    if best.cached and best.cached == max(c.cached for c in ranked):
        share = min(best.cached / demand.prompt_bytes, 1.0) if demand.prompt_bytes else 1.0
        return Route(ranked, Reason.SESSION if first.by_session else Reason.PREFIX, share)
    return Route(ranked, Reason.LEAST_TIME)


def _conserve_work(scored: list[_Scored]) -> bool:
    """Work-conserving, in place: a candidate that would wait in its engine's queue stays ahead of the quickest one
    with a free slot only when its own expected time (the wait included) is shorter; what only the cost of pushing
    another conversation's prompt out put ahead goes behind it. True when that changed who is first."""
    if scored[0].free:
        return False
    free = [item for item in scored if item.free]
    if not free:
        return False
    quickest = min(free, key=lambda item: (item.expected.own, item.turn))
    at = scored.index(quickest)
    ahead = scored[:at]
    keep = [item for item in ahead if item.expected.own < quickest.expected.own]
    scored[: at + 1] = [*keep, quickest, *(item for item in ahead if item.expected.own >= quickest.expected.own)]
    return scored[0] is quickest


def _returning(scored: list[_Scored], free: list[tuple[WorkerView, str]], demand: Demand) -> Route | None:
    """The history rule, whole: where the first holds none of the prompt, the candidate that was sent the most of it
    recently, among those expected within :data:`HISTORY_SLACK` of the quickest (and with a free slot where any
    candidate has one), first; None where the first holds some, where none was sent any of it, or where a candidate
    other than the one chosen holds some. The one chosen may hold some (holding more of a prompt must never rank a
    candidate lower than having been sent it)."""
    if scored[0].candidate.cached:
        return None
    history = {w.name: w.history for w, _ in free}
    limit = scored[0].expected.seconds * (1 + HISTORY_SLACK)
    near = [item for item in scored if item.expected.seconds <= limit]
    if any(item.free for item in scored):
        near = [item for item in near if item.free]
    if not near:
        return None
    chosen = max(near, key=lambda item: history[item.candidate.worker])  # the first of equals: the quickest
    seen = history[chosen.candidate.worker]
    rest = tuple(item.candidate for item in scored if item is not chosen)
    if not seen or any(c.cached for c in rest):
        return None
    share = min(seen / demand.prompt_bytes, 1.0) if demand.prompt_bytes else 1.0
    return Route((chosen.candidate, *rest), Reason.HISTORY, share)


def _known_or(values: list[float | None], default: float) -> float:
    """The mean of the known values (0 is a value), or ``default`` when none is known."""
    mean = _mean(values)
    return default if mean is None else mean


def _mean(values: list[float | None]) -> float | None:
    """The mean of the known values, or None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
