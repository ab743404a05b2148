"""Per-worker live state and the fleet that owns it.

Mutable, owned by one event loop: the poller writes health/inventory, the gateway writes in-flight
counts and speed observations. ``view()`` freezes what the pure router needs for one request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnout.config import Settings, Worker, WorkerType
from turnout.core.endpoint_health import EndpointState
from turnout.core.placement import PlacementRules
from turnout.core.routing import WorkerView
from turnout.core.signals import smooth
from turnout.state.placement_store import PlacementStore
from turnout.upstream.http1 import DialGuard

__all__ = ["External", "Fleet", "WorkerState"]


@dataclass(slots=True)
class External:
    """What makes a worker an external endpoint: namespaced models, SSRF-guarded dials, health states."""

    prefix: str  # "<endpoint>/": clients ask for "<endpoint>/<model>"
    guard: DialGuard
    fallback_model: str | None = None
    latency_budget_ms: int | None = None
    state: EndpointState = EndpointState.UNKNOWN
    last_check: float | None = None
    latency_ms: float | None = None
    hint: str | None = None

    def upstream_name(self, model: str) -> str:
        return model.removeprefix(self.prefix)


@dataclass(slots=True)
class WorkerState:
    config: Worker
    healthy: bool = False
    checked: bool = False  # at least one poll finished
    last_error: str | None = None
    failures: int = 0
    inventory: frozenset[str] | None = None  # None until fetched once
    tags: dict[str, dict[str, Any]] = field(default_factory=dict)  # raw inventory entries by name
    loaded: frozenset[str] = frozenset()
    ps: list[dict[str, Any]] = field(default_factory=list)  # raw /api/ps entries
    in_flight: int = 0
    completed: int = 0  # requests finished here (success or not), for idle detection
    speed: dict[str, float] = field(default_factory=dict)  # model -> smoothed tokens/s
    gpu_util: float | None = None
    gpu_memory: float | None = None
    offload: float | None = None
    external: External | None = None
    claim: str | None = None  # set for a ModelClaim binding (an engine on a GPU pool pod)
    # Derived once from the config: read on every request, so never recomputed there.
    base_url: str = field(init=False)
    baseline: PlacementRules = field(init=False)
    headers: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.base_url = self.config.base_url
        self.baseline = self.config.model_placement.rules()
        self.headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            self.headers["Authorization"] = f"Bearer {self.config.api_key}"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def vram_pressure(self) -> float | None:
        known = [v for v in (self.offload, self.gpu_memory) if v is not None]
        return max(known) if known else None

    def observe_speed(self, model: str, rate: float | None) -> None:
        if rate is not None:
            self.speed[model] = smooth(self.speed.get(model), rate)

    def mark_down(self, error: str) -> None:
        self.healthy = False
        self.last_error = error


class Fleet:
    def __init__(self, settings: Settings, placement: PlacementStore) -> None:
        self.settings = settings
        self.placement = placement
        self.workers: dict[str, WorkerState] = {w.name: WorkerState(w) for w in settings.workers}
        self.endpoints = 0  # how many external endpoints are in ``workers`` (kept by the endpoint manager)
        self.bindings: dict[str, WorkerState] = {}  # model name -> its claim's engine (kept by the claim bindings)

    def rules(self, name: str) -> tuple[PlacementRules, str]:
        """Effective rules for a worker and their source: ``override`` or ``config``."""
        override = self.placement.get(name)
        if override is not None:
            return override, "override"
        return self.workers[name].baseline, "config"

    def views(self, model: str) -> list[WorkerView]:
        """Views of the workers that may serve ``model``: its endpoint alone for "<endpoint>/<model>",
        otherwise the fleet's own workers (endpoints never serve un-namespaced names)."""
        endpoint = self.endpoint_for(model) or self.bindings.get(model)
        if endpoint is not None:
            candidates = [endpoint]
        elif self.endpoints or self.bindings:
            candidates = [s for s in self.workers.values() if s.external is None and s.claim is None]
        else:
            candidates = list(self.workers.values())
        out = []
        for state in candidates:
            rules, _ = self.rules(state.name)
            out.append(
                WorkerView(
                    name=state.name,
                    healthy=state.healthy,
                    rules=rules,
                    inventory=state.inventory,
                    loaded=state.loaded,
                    in_flight=state.in_flight,
                    max_concurrent=state.config.max_concurrent,
                    tokens_per_s=state.speed.get(model),
                    gpu_util=state.gpu_util,
                    vram_pressure=state.vram_pressure,
                )
            )
        return out

    def endpoint_for(self, model: str) -> WorkerState | None:
        """The external endpoint a namespaced model name ("<endpoint>/<model>") belongs to."""
        if not self.endpoints:
            return None
        name = model.split("/", 1)[0]
        state = self.workers.get(name)
        if state is not None and state.external is not None and model.startswith(state.external.prefix):
            return state
        return None

    def is_openai(self, name: str) -> bool:
        return self.workers[name].config.type is WorkerType.OPENAI
