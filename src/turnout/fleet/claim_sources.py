"""Where the gateway learns about ModelClaims: the in-process local controller, or a Kubernetes cluster that
the operator reconciles (claims' statuses and the routing annotations on pool pods)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from turnout.controller.agents import Activity, AgentClient
from turnout.controller.local import LocalController
from turnout.controller.status import phase_of
from turnout.core.claims import ClaimPhase

__all__ = ["ClaimSource", "ClaimView", "LocalSource", "WakeTarget", "parse_route"]


@dataclass(frozen=True, slots=True)
class ClaimView:
    key: str  # the claim's name locally, "<namespace>/<name>" on Kubernetes
    model: str
    phase: ClaimPhase
    route: tuple[str, int] | None  # (address, port) while the routing annotation has a port


@dataclass(frozen=True, slots=True)
class WakeTarget:
    agent_url: str
    pod: str
    model: str
    sleep_id: str  # names this sleep the same way on every gateway replica (the engine's transition time)


class ClaimSource(Protocol):
    agents: AgentClient
    on_route_change: Callable[[], None] | None
    activity: Callable[[str], Activity | None]

    async def refresh(self) -> None: ...

    def views(self) -> list[ClaimView]: ...

    async def wake_target(self, key: str) -> WakeTarget | None: ...


def parse_route(note: str | None) -> int:
    """The port in a ``modelclaim.aibrix.ai/<claim>`` annotation; 0 when absent, unroutable or malformed."""
    if not note:
        return 0
    try:
        port = json.loads(note).get("port")
    except (ValueError, AttributeError):
        return 0
    return port if isinstance(port, int) and 0 < port < 65536 else 0


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
            out.append(ClaimView(claim, model, phase, None if route is None else (route[0].address, route[1])))
        return out

    async def wake_target(self, key: str) -> WakeTarget | None:
        status = self.controller.statuses.get(key, {})
        pool = self.controller.pools.get(status.get("pod") or "")
        if pool is None:
            return None
        model = str(status.get("model") or key)
        engine = self.controller.reports.get(pool.name, {}).get(model, {})
        sleep_id = str(engine.get("last_transition", status.get("lastTransitionTime")))
        return WakeTarget(pool.agent_url, pool.name, model, sleep_id)
