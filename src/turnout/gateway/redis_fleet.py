"""What gateway replicas learn of the fleet, shared through Redis (``storage.redis_url``): learned speeds, what each
engine was seen running at once, the models taken out on a worker after their requests failed, and one probe of
each worker at a time.

**Figures** (:class:`FleetSync`): every :data:`SYNC_S` each replica writes what it learned itself (one key,
``P:fig:<replica>``, expiring after a few periods: bounded writes whatever its traffic) and reads the other live
replicas' (``P:reps``); each worker's and model's figures are then pooled with its own
(:func:`turnout.core.signals.pool`, weighted by the answers that taught them), what an engine was seen running at
once counts wherever it was seen, and a model another replica took out on a worker is out here too, for the time it
has left there. Times travel as ages and remainders (seconds), never as one machine's clock.

**Probes** (:class:`SharedProbes`): one replica at a time probes a given worker (a lease, ``P:probe:<worker>``,
for a poll interval), and none probes a worker that may be disturbed by it (an OpenAI-style server that is not
known to answer beside its requests) while any replica has a request in flight there (the occupancy's leases).
The one that probed publishes what it found (``P:health:<worker>``: health, why down, the inventory, residency,
what the engine says of itself), and the others take it from there.

Redis away: each replica learns and probes on its own, as a single gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson

from turnout.core.health import Event, ModelHealth
from turnout.core.parallelism import Parallelism, Source
from turnout.core.signals import pool
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.redis_occupancy import RedisOccupancy

__all__ = ["SYNC_S", "FleetSync", "SharedProbes"]

log = logging.getLogger("turnout.gateway")

SYNC_S = 1.0

_PROBE = """
local P, worker, replica, hold_ms, idle_only = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'
if idle_only then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('ZCOUNT', P .. ':l:w:' .. worker, '(' .. now, '+inf') > 0 then return 0 end
end
local key = P .. ':probe:' .. worker
local holder = redis.call('GET', key)
if holder and holder ~= replica then return -1 end
redis.call('SET', key, replica, 'PX', hold_ms)
return 1
"""


class FleetSync:
    """Publishes this replica's learned figures and reads the others', every :data:`SYNC_S`."""

    def __init__(self, occupancy: RedisOccupancy, fleet: Fleet) -> None:
        self.occupancy = occupancy
        self.fleet = fleet
        self._redis = occupancy._redis
        self._p = occupancy._p
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._syncing(), name="turnout-fleet-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _syncing(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            if self.occupancy.up:
                with contextlib.suppress(Exception):  # Redis away: the occupancy says so; learn alone meanwhile
                    await self.sync()

    async def sync(self) -> None:
        now = time.monotonic()
        me = self.occupancy.replica
        ttl_ms = int(SYNC_S * 5000)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(f"{self._p}:fig:{me}", orjson.dumps(self.mine(now)), px=ttl_ms)
            pipe.zrange(f"{self._p}:reps", 0, -1)
            _, replicas = await pipe.execute()
        others = [r.decode() for r in replicas if r.decode() != me]
        if not others:
            return
        values = await self._redis.mget([f"{self._p}:fig:{r}" for r in others])
        self.adopt([orjson.loads(v) for v in values if v], now)

    def mine(self, now: float) -> dict[str, Any]:
        """What this replica learned itself, by worker and model (ages and remainders in seconds)."""
        ttl_s = self.fleet.settings.routing.speed_ttl_s
        out: dict[str, Any] = {}
        for state in self.fleet.workers.values():
            entry: dict[str, Any] = {}
            for model, learned in state.learned.items():
                prefill, decode, service = learned.fresh(now, ttl_s)
                levels = {str(k): [c, round(now - at, 3)] for k, (c, at) in learned.parallel.seen.items()}
                entry[model] = {
                    "p": prefill,
                    "pn": learned.prefill_n if prefill is not None else 0,
                    "d": decode,
                    "dn": learned.decode_n if decode is not None else 0,
                    "s": service,
                    "lv": levels,
                }
            out_models = {
                model: [round(h.out_until - now, 3), h.reason, h.failures, h.outs]
                for model, h in state.models.items()
                if h.out_until is not None and h.out(now)
            }
            if entry or out_models:
                out[state.name] = {"m": entry, "out": out_models}
        return out

    def adopt(self, documents: list[dict[str, Any]], now: float) -> None:
        """The other replicas' figures, pooled into each worker's and model's (replacing what they said before)."""
        merged: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for document in documents:
            for worker, entry in document.items():
                state = self.fleet.workers.get(worker)
                if state is None or not isinstance(entry, dict):
                    continue
                for model, figures in (entry.get("m") or {}).items():
                    merged.setdefault((worker, model), []).append(figures)
                for model, (left, reason, failures, outs) in (entry.get("out") or {}).items():
                    _take_out(state, model, now + float(left), reason, int(failures), int(outs))
        for (worker, model), figures in merged.items():
            learned = self.fleet.workers[worker].figures(model)
            prefill = pool((f.get("p"), int(f.get("pn") or 0)) for f in figures)
            decode = pool((f.get("d"), int(f.get("dn") or 0)) for f in figures)
            services = [f["s"] for f in figures if f.get("s")]
            service = sum(services) / len(services) if services else None
            learned.peers = (prefill[0], prefill[1], decode[0], decode[1], service)
            learned.peers_at = now
            learned.parallel.peers = _levels(figures, now)


def _levels(figures: list[dict[str, Any]], now: float) -> dict[int, tuple[int, float]]:
    levels: dict[int, tuple[int, float]] = {}
    for f in figures:
        for level, (count, age) in (f.get("lv") or {}).items():
            n, at = levels.get(int(level), (0, 0.0))
            levels[int(level)] = (n + int(count), max(at, now - float(age)))
    return levels


def _take_out(state: WorkerState, model: str, until: float, reason: str | None, failures: int, outs: int) -> None:
    """A model another replica took out on ``state``'s worker: out here too, as long as there (unless it already
    is, for longer)."""
    health = state.models.get(model)
    if health is not None and health.out_until is not None and health.out_until >= until:
        return
    state.models[model] = ModelHealth(failures, until, outs, reason)
    if health is None or not health.out(until - 1e-9):
        log.warning('%s: model "%s" is out (%s), as another gateway replica found', state.label, model, reason)


class SharedProbes:
    """The poller's coordinator (:class:`turnout.fleet.poller.Poller`'s ``probes``): who probes a worker, and what
    the others take from it."""

    def __init__(self, occupancy: RedisOccupancy, interval_s: float) -> None:
        self.occupancy = occupancy
        self._redis = occupancy._redis
        self._p = occupancy._p
        self._hold_ms = max(int(interval_s * 1000), 100)
        self._probe = self._redis.register_script(_PROBE)

    async def may_probe(self, state: WorkerState, idle_only: bool) -> bool | None:
        """True: this replica probes ``state``'s worker now (it holds the lease); None: another one does; False: no
        replica may (``idle_only`` and a request of any replica in flight there)."""
        if not self.occupancy.up:
            return True
        args: list[Any] = [self._p, state.name, self.occupancy.replica, self._hold_ms, 1 if idle_only else 0]
        try:
            answer = int(await self._probe(args=args))
        except Exception:  # Redis away: probe as a single gateway does
            return True
        return True if answer == 1 else None if answer < 0 else False

    async def share(self, state: WorkerState) -> None:
        """What this replica's probe found, for the others."""
        if not self.occupancy.up:
            return
        document = {
            "healthy": state.healthy,
            "checked": state.checked,
            "down": state.down_reason,
            "error": state.last_error,
            "inventory": None if state.inventory is None else sorted(state.inventory),
            "stale": state.inventory_stale,
            "inventory_error": state.inventory_error,
            "tags": state.tags,
            "loaded": sorted(state.loaded),
            "ps": state.ps,
            "offload": state.offload,
            "family": state.engine_family,
            "props": state.engine_props,
            "parallelism": None if state.engine_parallelism is None else state.engine_parallelism.to_json(),
            "parallelism_exact": state.engine_parallelism is not None and state.engine_parallelism.exact,
        }
        with contextlib.suppress(Exception):
            await self._redis.set(f"{self._p}:health:{state.name}", orjson.dumps(document), px=self._hold_ms * 3)

    async def adopt(self, state: WorkerState, now: float) -> bool:
        """Take what the replica that probed ``state``'s worker found; False when it published nothing yet (a
        replica starting while another holds the lease: it probes itself, once)."""
        try:
            raw = await self._redis.get(f"{self._p}:health:{state.name}")
        except Exception:
            return False
        if not raw:
            return False
        found = orjson.loads(raw)
        if found.get("checked"):
            if found.get("healthy"):
                state.record(Event.ALIVE)
            else:
                state.record(Event.PROBE_FAILED, found.get("error"), found.get("down") or "not answering")
        inventory = found.get("inventory")
        if inventory is not None:
            state.inventory = frozenset(inventory)
            state.tags = found.get("tags") or {}
            state.inventory_fetched(now)
        state.inventory_stale = bool(found.get("stale"))
        state.inventory_error = found.get("inventory_error")
        state.loaded = frozenset(found.get("loaded") or ())
        state.ps = found.get("ps") or []
        state.offload = found.get("offload")
        state.engine_family = found.get("family")
        state.engine_props = found.get("props")
        figure = found.get("parallelism")
        if isinstance(figure, dict) and figure.get("source") in Source.__members__.values():
            exact = found.get("parallelism_exact") is True
            state.engine_parallelism = Parallelism(
                figure.get("slots"), Source(figure["source"]), figure.get("why", ""), exact=exact
            )
        return True
