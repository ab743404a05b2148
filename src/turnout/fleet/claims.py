"""ModelClaim bindings in the gateway: each claim's engine is an upstream while it is Active.

After every controller tick the bindings follow the claim statuses. A request for a claimed model that is
not Active is answered without touching the engine: Sleeping -> one asynchronous wake per binding (however
many requests arrive) and 503 with ``Retry-After: 10``; Pending/Scheduling/Loading/Activating -> 503 with
``Retry-After``; Failed -> 503 without. The gateway never holds or replays the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson

from turnout.config import Worker
from turnout.controller.local import LocalController
from turnout.core.claims import ClaimPhase
from turnout.errors import TurnoutError, Unavailable, UpstreamError
from turnout.fleet.state import Fleet, WorkerState
from turnout.upstream.client import UpstreamClient

__all__ = ["ClaimBindings"]

log = logging.getLogger("turnout.claims")

SLEEPING_RETRY_S = 10
ACTIVATING_RETRY_S = 5


class ClaimBindings:
    def __init__(self, fleet: Fleet, controller: LocalController, client: UpstreamClient, interval_s: float) -> None:
        self.fleet = fleet
        self.controller = controller
        self.client = client
        self.interval_s = interval_s
        self.phases: dict[str, tuple[str, ClaimPhase]] = {}  # model -> (claim, phase)
        self._wakes: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.on_change: Any = None

    def sync(self) -> None:
        statuses = self.controller.files.statuses()
        docs = {d["metadata"]["name"]: d for d in self.controller.files.all()}
        seen: set[str] = set()
        for claim, status in statuses.items():
            doc = docs.get(claim)
            if doc is None or doc.get("deleting"):
                continue
            model = (doc.get("spec") or {}).get("modelName") or claim
            phase = ClaimPhase(status["phase"])
            seen.add(model)
            self.phases[model] = (claim, phase)
            pool = self.controller.pools.get(status.get("pod") or "")
            if phase is ClaimPhase.ACTIVE and pool is not None and status.get("port"):
                url = f"http://{pool.address}:{status['port']}"
                current = self.fleet.bindings.get(model)
                if current is None or current.base_url != url:
                    state = WorkerState(
                        Worker.model_validate({"name": f"claim-{claim}", "url": url, "type": "openai"}), claim=claim
                    )
                    state.inventory = state.loaded = frozenset({model})
                    state.tags = {model: {"id": model, "object": "model", "owned_by": f"claim/{claim}"}}
                    self.fleet.workers[state.name] = state
                    self.fleet.bindings[model] = state
                self.fleet.bindings[model].healthy = True
            else:
                self._unbind(model)
        for model in list(self.phases):
            if model not in seen:
                self.phases.pop(model)
                self._unbind(model)
        if self.on_change is not None:
            self.on_change()

    def _unbind(self, model: str) -> None:
        state = self.fleet.bindings.pop(model, None)
        if state is not None:
            self.fleet.workers.pop(state.name, None)

    def gate(self, model: str) -> None:
        """Raise the 503 for a claimed model that is not Active (after starting a wake when it sleeps)."""
        known = self.phases.get(model)
        if known is None or model in self.fleet.bindings:
            return
        claim, phase = known
        if phase is ClaimPhase.SLEEPING:
            self._wake_once(claim, model)
            raise Unavailable(
                f'model "{model}" is asleep; it is being woken, retry shortly',
                code="model_waking",
                retry_after=SLEEPING_RETRY_S,
            )
        if phase is ClaimPhase.FAILED:
            raise Unavailable(
                f'model "{model}" failed to start (claim {claim}); see `turnout claim list`', code="model_failed"
            )
        raise Unavailable(
            f'model "{model}" is {phase.value.lower()}; retry shortly',
            code="model_activating",
            retry_after=ACTIVATING_RETRY_S,
        )

    def _wake_once(self, claim: str, model: str) -> None:
        running = self._wakes.get(model)
        if running is not None and not running.done():
            return
        self._wakes[model] = asyncio.create_task(self._wake(claim, model), name=f"wake-{model}")

    async def _wake(self, claim: str, model: str) -> None:
        status = self.controller.files.statuses().get(claim, {})
        pool = self.controller.pools.get(status.get("pod") or "")
        if pool is None:
            return
        body = orjson.dumps({"model_name": model, "operation_id": f"wake-{claim}-{status.get('lastTransitionTime')}"})
        try:
            async with self.client.request(
                "POST",
                f"{pool.agent_url}/v1/runtime/models/wake",
                label=pool.name,
                body=body,
                headers={"Content-Type": "application/json"},
                timeout_s=120,
            ) as r:
                await r.read()
        except UpstreamError as exc:
            log.warning("waking %s failed: %s", model, exc.message)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="turnout-claims")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._wakes.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            try:
                await self.controller.tick()
                self.sync()
            except TurnoutError as exc:
                log.warning("claims tick failed: %s", exc.message)
            except Exception:
                log.exception("claims tick failed")
            await asyncio.sleep(self.interval_s)
