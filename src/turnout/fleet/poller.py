"""Background polling of every worker: health, inventory, residency and GPU signals.

Health and inventory are separate questions, asked separately:

* Ollama workers: ``/api/version`` is the liveness probe (served without touching a model runner);
  ``/api/tags`` is inventory and ``/api/ps`` residency. Their failures (timeout, 5xx, bad JSON) make
  the inventory stale, never the worker down. Probed every round, busy or not.
* OpenAI-style workers: ``/v1/models`` is the only probe, and any HTTP answer proves the worker alive;
  a 5xx or bad JSON there only makes the inventory stale (every listed model counts as loaded). These
  are probed only when nothing is in flight there through this gateway: on llama.cpp a probe during a
  stream ends that stream (see :mod:`turnout.core.health`). Health then comes from the proxied requests.

A probe timeout while the worker's requests are progressing does not count. A failed inventory keeps
the last known one, marked stale (``inventory_stale``, ``inventory_error``); never fetched stays None,
which routing treats as unknown (fail open). A worker's optional ``metrics_url`` is scraped for GPU
utilisation and memory. One poll round is run before the gateway starts serving, so routing starts from
real health, not a guess. Decisions are :mod:`turnout.core.health`'s; this module applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from prometheus_client.parser import text_string_to_metric_families

from turnout.config import WorkerType
from turnout.core.engines import BATCHING, FAMILIES, family_of, queue_gauges, read_gauges, slots_from_props
from turnout.core.health import (
    Event,
    ProbePolicy,
    ProbeResult,
    failure_reason,
    probe_event,
    probe_policy,
    should_probe,
)
from turnout.core.parallelism import Parallelism, Source, engine_capacity
from turnout.core.signals import gpu_from_samples, vram_pressure_from_ps
from turnout.errors import UpstreamError
from turnout.fleet.state import Fleet, WorkerState
from turnout.upstream.client import ConnectFailed, UpstreamClient

__all__ = ["Poller", "Probes", "apply_openai_models", "apply_tags"]

log = logging.getLogger("turnout.fleet")


@dataclass(frozen=True, slots=True)
class _Reply:
    """One GET as the health rules see it: did an answer come, and what was in it."""

    result: ProbeResult
    status: int | None = None
    body: bytes | None = None
    error: str | None = None  # why there is no usable body
    code: str | None = None  # the failure's error code (``connect_refused``, ``timeout``), when it failed

    @property
    def reason(self) -> str:
        """The failure in a few words, for the state-change log and the no-healthy-worker 503."""
        return failure_reason(self.code)

    def json(self, label: str, path: str) -> Any:
        """The decoded body of a 2xx answer; UpstreamError for anything else (an inventory failure)."""
        if self.error is not None:
            raise UpstreamError(self.error)
        if self.status is None or self.status >= 300:
            raise UpstreamError(f"{label}: HTTP {self.status} from {path}")
        try:
            return orjson.loads(self.body or b"")
        except orjson.JSONDecodeError:
            raise UpstreamError(f"{label}: {path} did not return JSON") from None


class Probes(Protocol):
    """Gateway replicas that probe together (:class:`turnout.gateway.redis_fleet.SharedProbes`): one at a time per
    worker, the others taking what it found."""

    async def may_probe(self, state: WorkerState, idle_only: bool) -> bool | None: ...

    async def share(self, state: WorkerState) -> None: ...

    async def adopt(self, state: WorkerState, now: float) -> bool: ...


class Poller:
    def __init__(
        self,
        fleet: Fleet,
        client: UpstreamClient,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fleet = fleet
        self.client = client
        self.on_change = on_change
        self.clock = clock  # the proxy's record_* calls use the same clock
        self.probes: Probes | None = None  # with other replicas: who probes which worker (None: this one, all)
        self._task: asyncio.Task[None] | None = None

    async def poll_all(self) -> None:
        # endpoints and claim bindings have their own health (fleet.endpoints, fleet.claims); a claim's engine,
        # known by its claim, is asked what it says of itself (llama.cpp's /props, a batching engine's gauges)
        workers = [s for s in self.fleet.workers.values() if s.external is None and s.claim is None]
        engines = [s for s in self.fleet.workers.values() if s.claim is not None and s.healthy and s.engine_family]
        await asyncio.gather(*(self.poll(state) for state in workers), *(self._engine(state) for state in engines))
        self.fleet.placement.refresh()
        if self.on_change is not None:
            self.on_change()

    async def poll(self, state: WorkerState) -> None:
        cfg = state.config
        health = self.fleet.settings.health
        ollama = cfg.type is WorkerType.OLLAMA
        policy = probe_policy(ollama, state.engine_family)
        started = self.clock()
        probe = should_probe(
            policy,
            in_flight=state.in_flight,
            healthy=state.healthy,
            inventory_current=state.inventory is not None and not state.inventory_stale,
            last_progress=state.last_progress,
            now=started,
            interval_s=health.interval_s,
        )
        shared = self.probes
        if probe and shared is not None:
            may = await shared.may_probe(state, policy is ProbePolicy.IDLE_ONLY)
            if may is not True:  # another replica probes it, or none may now: what was found there
                adopted = await shared.adopt(state, self.clock())
                # another replica holds the probe and published nothing yet (this one starts): its own look, once;
                # never a look at an engine that a probe may disturb while a request runs there
                probe = may is None and not adopted and not state.checked
        if probe:
            await self._probe(state, ollama, started)
            if shared is not None:
                await shared.share(state)
        if cfg.metrics_url is not None:
            await self._scrape_gpu(state, str(cfg.metrics_url), health.timeout_s)

    async def _probe(self, state: WorkerState, ollama: bool, started: float) -> None:
        """Liveness, then inventory and what the engine says of itself."""
        window_s = self.fleet.settings.health.timeout_s
        reply = await self._get(state, "/api/version" if ollama else "/v1/models")
        event = probe_event(reply.result, started=started, last_progress=state.last_progress, window_s=window_s)
        if event is None:
            log.debug("%s: probe %s while requests progress; not counted", state.name, reply.result.value)
        else:
            state.record(event, reply.error, None if event is Event.ALIVE else reply.reason)
        if reply.result is ProbeResult.ANSWERED:
            if ollama:
                await self._ollama_inventory(state)
            else:
                self._inventory(state, reply, "/v1/models", apply_openai_models)
                await self._engine(state)

    async def _get(self, state: WorkerState, path: str) -> _Reply:
        url = f"{state.base_url}{path}"
        limit_s = self.fleet.settings.health.timeout_s
        try:
            async with self.client.request(
                "GET", url, label=state.name, timeout_s=limit_s, headers=state.headers
            ) as resp:
                try:
                    return _Reply(ProbeResult.ANSWERED, resp.status, await resp.read())
                except UpstreamError as exc:  # the headers came, so it is up; the body did not
                    return _Reply(ProbeResult.ANSWERED, resp.status, error=exc.message)
        except ConnectFailed as exc:
            return _Reply(ProbeResult.UNREACHABLE, error=exc.message, code=exc.code)
        except UpstreamError as exc:
            result = ProbeResult.TIMED_OUT if exc.code == "timeout" else ProbeResult.BROKEN
            return _Reply(result, error=exc.message, code=exc.code)

    async def _ollama_inventory(self, state: WorkerState) -> None:
        tags, ps = await asyncio.gather(self._get(state, "/api/tags"), self._get(state, "/api/ps"))
        self._inventory(state, tags, "/api/tags", apply_tags)
        try:
            _apply_ps(state, ps.json(state.name, "/api/ps"))
        except UpstreamError as exc:  # residency unknown this round: keep the last known
            log.debug("%s: /api/ps failed: %s", state.name, exc.message)

    def _inventory(
        self, state: WorkerState, reply: _Reply, path: str, apply: Callable[[WorkerState, Any], None]
    ) -> None:
        try:
            apply(state, reply.json(state.name, path))
        except UpstreamError as exc:
            if state.inventory_error is None:
                log.warning("%s: inventory poll failed, keeping the last known: %s", state.name, exc.message)
            state.inventory_failed(exc.message)
            return
        state.inventory_fetched(self.clock())

    async def _engine(self, state: WorkerState) -> None:
        """What an engine known by its listing says of its parallelism: llama.cpp's ``/props`` (once per start of
        the worker), a batching engine's queue gauges (every round)."""
        family = state.engine_family
        if family == "llamacpp" and state.engine_props is None:
            reply = await self._get(state, "/props")
            try:
                props = reply.json(state.name, "/props")
            except UpstreamError as exc:
                log.debug("%s: /props failed: %s", state.name, exc.message)
                return
            state.engine_props = props if isinstance(props, dict) else {}
            slots = slots_from_props(props)
            if slots is not None:
                why = f"llama.cpp's /props: total_slots {slots}"
                state.engine_parallelism = Parallelism(slots, Source.ENGINE, why, exact=True)
        elif family in BATCHING:
            reply = await self._get(state, "/metrics")
            if reply.status != 200 or reply.body is None:
                return  # SGLang serves /metrics only with --enable-metrics
            try:
                samples = _samples(reply.body.decode("utf-8", "replace"))
            except ValueError:
                return
            running, waiting = queue_gauges(samples)
            if running is None:
                return
            state.engine_seen_running = max(state.engine_seen_running, running)
            state.engine_parallelism = read_gauges(
                family, state.engine_parallelism, running, waiting, state.engine_seen_running
            )

    async def _scrape_gpu(self, state: WorkerState, url: str, limit_s: float) -> None:
        try:
            text = await self.client.get_text(url, label=state.name, timeout_s=limit_s)
            samples = _samples(text)
        except (UpstreamError, ValueError) as exc:
            log.debug("%s: metrics scrape failed: %s", state.name, exc)
            state.gpu_util = state.gpu_memory = None
            return
        state.gpu_util, state.gpu_memory = gpu_from_samples(samples)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="turnout-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        interval = self.fleet.settings.health.interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.poll_all()
            except Exception:  # a bug in one round must not stop health checking for good
                log.exception("poll round failed")


def _samples(text: str) -> list[tuple[str, float]]:
    """Every sample of a Prometheus exposition (ValueError when it is not one)."""
    return [
        (sample.name, float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def apply_tags(state: WorkerState, body: Any) -> None:
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        raise UpstreamError(f"{state.name}: /api/tags has no models list")
    tags = {m["name"]: m for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)}
    state.tags = tags
    state.inventory = frozenset(tags)


def _apply_ps(state: WorkerState, body: Any) -> None:
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return
    entries = [m for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)]
    state.ps = entries
    state.loaded = frozenset(m["name"] for m in entries)
    state.offload = vram_pressure_from_ps(entries)


def apply_openai_models(state: WorkerState, body: Any) -> None:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise UpstreamError(f"{state.name}: /v1/models has no data list")
    entries = {m["id"]: m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}
    state.tags = entries
    state.inventory = frozenset(entries)
    state.loaded = state.inventory
    family = family_of(entries.values())
    if family != state.engine_family:
        if family is not None:
            log.info("%s is %s's server (its model listing says so)", state.label, FAMILIES[family])
        adopt_family(state, family)


def adopt_family(state: WorkerState, family: str | None) -> None:
    """``state``'s engine is of ``family`` (a key of :data:`FAMILIES`, or None: not known): what the poller then
    asks it of itself starts again (llama.cpp's ``/props``), and a batching engine is taken to batch before its
    gauges say how much (SGLang serves them only with --enable-metrics)."""
    state.engine_family = family
    state.engine_props = None
    state.engine_parallelism = None if family not in BATCHING else engine_capacity(FAMILIES[family], None, None, 0)
