"""Carrying out a pool's policy (KV limits, idle sleep, invalid-policy events) for either driver."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from turnout.controller.agents import Activity, AgentClient, observation
from turnout.controller.metrics import ControllerMetrics
from turnout.core.lifecycle import PolicyEvent, PoolMemory, SetKvLimit, SleepIdle, pool_step
from turnout.core.reconcile import EngineInfo, route_annotation

__all__ = ["PolicyRunner", "PoolTarget"]

log = logging.getLogger("turnout.controller")

RouteSetter = Callable[[str, str], Awaitable[None]]  # (claim, annotation value)
EventSink = Callable[
    [str | None, str, str, str], Awaitable[None]
]  # (claim or None for the pool, type, reason, message)


@dataclass(frozen=True, slots=True)
class PoolTarget:
    """One pool pod as the policy sees it this tick."""

    pod: str
    agent_url: str
    gpus: int
    policy_text: str | None
    engines: Sequence[Mapping[str, Any]]  # as the agent reported them
    claims: Mapping[str, str]  # model -> claim bound to this pod
    namespace: str = "local"
    deployment: str = ""
    accelerators: int = 0  # GPUs the agent's snapshot reports (idle sleep goes by these, not the pod's limits)


class PolicyRunner:
    def __init__(self, agents: AgentClient, metrics: ControllerMetrics) -> None:
        self.agents = agents
        self.metrics = metrics
        self.memory: dict[str, PoolMemory] = {}
        self.operations = 0

    async def step(
        self,
        target: PoolTarget,
        now: float,
        *,
        set_route: RouteSetter,
        event: EventSink,
        activity: Callable[[str], Activity | None] = lambda claim: None,
    ) -> list[str]:
        """Apply one tick of the pool's policy; returns the claims that were put to sleep."""
        observed = [
            observation(target.claims[str(e["model_name"])], e, activity(target.claims[str(e["model_name"])]))
            for e in target.engines
            if str(e.get("model_name")) in target.claims
        ]
        result = pool_step(
            target.pod,
            target.gpus,
            target.policy_text,
            observed,
            self.memory.get(target.pod, PoolMemory()),
            now,
            accelerators=target.accelerators,
        )
        self.memory[target.pod] = result.memory
        self.metrics.pool(target.namespace, target.deployment or target.pod, result.policy_valid)
        ports = {str(e["model_name"]): int(e["port"]) for e in target.engines}
        slept: list[str] = []
        for action in result.actions:
            self.operations += 1
            op = f"{target.pod}-{self.operations}-{int(now * 1000)}"
            if isinstance(action, PolicyEvent):
                log.warning("pool %s: %s", target.pod, action.message)
                await event(None, "Warning", action.reason, action.message)
            elif isinstance(action, SetKvLimit):
                body = {"model_name": action.model, "limit_bytes": action.limit_bytes, "operation_id": f"kv-{op}"}
                problem = await self.agents.post(target.agent_url, target.pod, "/v1/runtime/models/kv-limit", body)
                if problem is None:
                    log.info("pool %s: KV limit of %s -> %d bytes", target.pod, action.model, action.limit_bytes)
            elif isinstance(action, SleepIdle):
                port = ports[action.model]
                await set_route(action.claim, route_annotation(action.model, EngineInfo("sleeping", False, port)))
                body = {"model_name": action.model, "level": 1, "operation_id": f"sleep-{op}"}
                problem = await self.agents.post(target.agent_url, target.pod, "/v1/runtime/models/sleep", body)
                if problem is None:
                    slept.append(action.claim)
                    await event(
                        action.claim, "Normal", "IdleSleep", f"{action.model} slept after {action.idle_s:.0f}s idle"
                    )
                else:
                    await set_route(action.claim, route_annotation(action.model, EngineInfo("active", True, port)))
                    await event(action.claim, "Warning", "SleepFailed", f"{action.model} stays routed: {problem}")
        return slept
