"""Background polling of every worker: health, inventory, residency and GPU signals.

Ollama workers: ``/api/tags`` (health + inventory) and ``/api/ps`` (residency, VRAM). OpenAI-style
workers: ``/v1/models`` (health + inventory; every listed model counts as loaded). A worker's optional
``metrics_url`` is scraped for GPU utilisation and memory. One poll round is run before the gateway
starts serving, so routing starts from real health, not a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from turnout.config import WorkerType
from turnout.core.signals import gpu_from_samples, vram_pressure_from_ps
from turnout.errors import UpstreamError
from turnout.fleet.state import Fleet, WorkerState
from turnout.upstream.client import UpstreamClient

__all__ = ["Poller", "apply_openai_models", "apply_tags"]

log = logging.getLogger("turnout.fleet")


class Poller:
    def __init__(self, fleet: Fleet, client: UpstreamClient, on_change: Callable[[], None] | None = None) -> None:
        self.fleet = fleet
        self.client = client
        self.on_change = on_change
        self._task: asyncio.Task[None] | None = None

    async def poll_all(self) -> None:
        # endpoints and claim bindings have their own health (fleet.endpoints, fleet.claims)
        workers = [s for s in self.fleet.workers.values() if s.external is None and s.claim is None]
        await asyncio.gather(*(self.poll(state) for state in workers))
        self.fleet.placement.refresh()
        if self.on_change is not None:
            self.on_change()

    async def poll(self, state: WorkerState) -> None:
        cfg = state.config
        timeout = self.fleet.settings.health.timeout_s
        headers = state.headers
        try:
            if cfg.type is WorkerType.OLLAMA:
                tags = await self.client.get_json(
                    f"{state.base_url}/api/tags", label=cfg.name, timeout_s=timeout, headers=headers
                )
                apply_tags(state, tags)
                try:
                    ps = await self.client.get_json(
                        f"{state.base_url}/api/ps", label=cfg.name, timeout_s=timeout, headers=headers
                    )
                    _apply_ps(state, ps)
                except UpstreamError as exc:
                    log.debug("%s: /api/ps failed: %s", cfg.name, exc)
            else:
                models = await self.client.get_json(
                    f"{state.base_url}/v1/models", label=cfg.name, timeout_s=timeout, headers=headers
                )
                apply_openai_models(state, models)
        except UpstreamError as exc:
            state.failures += 1
            state.checked = True
            if state.failures >= self.fleet.settings.health.failures_to_down:
                if state.healthy:
                    log.warning("worker %s is down: %s", cfg.name, exc.message)
                state.mark_down(exc.message)
            return
        if not state.healthy:
            log.info("worker %s is up (%d models)", cfg.name, len(state.inventory or ()))
        state.healthy = True
        state.checked = True
        state.failures = 0
        state.last_error = None
        if cfg.metrics_url is not None:
            await self._scrape_gpu(state, str(cfg.metrics_url), timeout)

    async def _scrape_gpu(self, state: WorkerState, url: str, limit_s: float) -> None:
        try:
            text = await self.client.get_text(url, label=state.name, timeout_s=limit_s)
            samples = [
                (sample.name, float(sample.value))
                for family in text_string_to_metric_families(text)
                for sample in family.samples
            ]
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
