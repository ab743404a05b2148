"""Where the gateway learns about ModelClaims: the in-process local controller, or a Kubernetes cluster that
the operator reconciles (claims' statuses and the routing annotations on pool pods)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from turnout.controller.agents import Activity, AgentClient
from turnout.controller.local import LocalController
from turnout.controller.status import bound_pod, phase_of
from turnout.core.claims import ClaimPhase, claim_engine, schedules_by_priority
from turnout.core.priority import Ordering
from turnout.core.reconcile import parse_route

__all__ = ["ClaimSource", "ClaimView", "LocalSource", "WakeTarget", "effective_phase", "sleeping_engine"]


@dataclass(frozen=True, slots=True)
class ClaimView:
    key: str  # the claim's name locally, "<namespace>/<name>" on Kubernetes
    model: str
    phase: ClaimPhase
    route: tuple[str, int] | None  # (address, port) while the routing annotation has a port
    placed: bool  # bound to a pod (a claim no pod can take stays Scheduling with none)
    # how its engine orders requests by their own priority (its vLLM or SGLang args say so); None: it does not
    priority_ordering: Ordering | None = None
    engine: str | None = None  # the engine it runs (its spec's ``engine``: llamacpp, vllm, sglang); None: not known


@dataclass(frozen=True, slots=True)
class WakeTarget:
    agent_url: str
    pod: str
    model: str
    sleep_id: str  # names this sleep the same way on every gateway replica (the engine's transition time)


def sleeping_engine(engines: list[dict[str, Any]], model: str) -> str | None:
    """The sleep id of ``model``'s engine when its agent reports it sleeping (the time it went to sleep, the same
    on every gateway replica), else None: an engine that is awake or waking is not woken again."""
    engine = next((e for e in engines if e.get("model_name") == model), None)
    if engine is None or engine.get("phase") != "sleeping":
        return None
    return str(engine.get("last_transition"))


class ClaimSource(Protocol):
    agents: AgentClient
    on_route_change: Callable[[], None] | None
    activity: Callable[[str], Activity | None]

    async def refresh(self) -> None: ...

    def views(self) -> list[ClaimView]: ...

    async def wake_target(self, key: str) -> WakeTarget | None: ...


# The routing annotation is written before the status (it is what takes an engine off the route), so for a
# moment the status can lag (Active while the engine sleeps, Sleeping while it wakes): trust the route.
# States are AIBrix's (active, activating, sleeping, failed); "restarting" and "booting" are what earlier Turnout
# controllers wrote, read the same way.
_ROUTE_PHASES = {
    "sleeping": ClaimPhase.SLEEPING,
    "failed": ClaimPhase.FAILED,
    "activating": ClaimPhase.ACTIVATING,
    "restarting": ClaimPhase.ACTIVATING,
    "booting": ClaimPhase.LOADING,
}


def effective_phase(phase: ClaimPhase, route_state: str | None, routable: bool) -> ClaimPhase:
    routed = None if routable else _ROUTE_PHASES.get(route_state or "")
    if routed is None:
        return phase
    if routed in (ClaimPhase.ACTIVATING, ClaimPhase.LOADING) and phase not in (ClaimPhase.ACTIVE, ClaimPhase.SLEEPING):
        return phase  # on its way up already (Scheduling, Loading...): the status says more than the route
    return routed


class LocalSource:
    """The in-process local controller: each refresh is one reconcile tick."""

    def __init__(self, controller: LocalController) -> None:
        self.controller = controller
        self.agents = controller.agents

    @property
    def on_route_change(self) -> Callable[[], None] | None:
        return self.controller.on_route_change

    @on_route_change.setter
    def on_route_change(self, fn: Callable[[], None] | None) -> None:
        self.controller.on_route_change = fn

    @property
    def activity(self) -> Callable[[str], Activity | None]:
        return self.controller.activity

    @activity.setter
    def activity(self, fn: Callable[[str], Activity | None]) -> None:
        self.controller.activity = fn

    async def refresh(self) -> None:
        await self.controller.tick()

    def views(self) -> list[ClaimView]:
        docs = {d["metadata"]["name"]: d for d in self.controller.files.all()}
        out = []
        for claim, status in sorted(self.controller.statuses.items()):
            doc = docs.get(claim)
            phase = phase_of(status)
            if doc is None or doc.get("deleting") or phase is None:
                continue
            model = status.get("model") or (doc.get("spec") or {}).get("modelName") or claim
            route = self.controller.route(claim)
            _, state = parse_route(self.controller.annotation(claim))
            phase = effective_phase(phase, state, route is not None)
            where = None if route is None else (route[0].address, route[1])
            ranked = schedules_by_priority(claim, doc.get("spec"))
            engine = claim_engine(claim, doc.get("spec"))
            out.append(ClaimView(claim, model, phase, where, bound_pod(status) is not None, ranked, engine))
        return out

    async def wake_target(self, key: str) -> WakeTarget | None:
        """The agent is asked now (the last tick's report may predate a wake already sent)."""
        status = self.controller.statuses.get(key, {})
        pool = self.controller.pools.get(status.get("pod") or "")
        if pool is None:
            return None
        model = str(status.get("model") or key)
        report = await self.agents.report(pool.agent_url, pool.name)
        sleep_id = sleeping_engine(report.engines if report else [], model)
        return None if sleep_id is None else WakeTarget(pool.agent_url, pool.name, model, sleep_id)
