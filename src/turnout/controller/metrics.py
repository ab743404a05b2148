"""Controller metrics under the AIBrix names, so dashboards written for AIBrix work unchanged."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from turnout.core.claims import ClaimPhase

__all__ = ["ControllerMetrics"]

_STARTING = {ClaimPhase.SCHEDULING, ClaimPhase.LOADING, ClaimPhase.ACTIVATING}


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["namespace", "model"]
        self.desired = Gauge(
            "aibrix_modelclaim_desired_replicas", "replicas the claim asks for", labels, registry=self.registry
        )
        self.ready = Gauge(
            "aibrix_modelclaim_ready_replicas", "replicas active and routable", labels, registry=self.registry
        )
        self.activating = Gauge(
            "aibrix_modelclaim_activating", "1 while the claim's engine is starting", labels, registry=self.registry
        )
        self.activations = Counter(
            "aibrix_modelclaim_activation",
            "engine activations by result (success: became Active; failure: became Failed)",
            [*labels, "result"],
            registry=self.registry,
        )
        self.policy_valid = Gauge(
            "aibrix_modelclaim_pool_policy_valid",
            "1 when the pool's pool.aibrix.ai/policy annotation is valid, 0 when it was disabled",
            ["namespace", "deployment"],
            registry=self.registry,
        )

    def claim(self, namespace: str, model: str, previous: ClaimPhase | None, phase: ClaimPhase) -> None:
        self.desired.labels(namespace, model).set(1)
        self.ready.labels(namespace, model).set(1 if phase is ClaimPhase.ACTIVE else 0)
        self.activating.labels(namespace, model).set(1 if phase in _STARTING else 0)
        if phase is not previous:
            if phase is ClaimPhase.ACTIVE and previous in _STARTING | {None, ClaimPhase.PENDING}:
                self.activations.labels(namespace, model, "success").inc()
            elif phase is ClaimPhase.FAILED:
                self.activations.labels(namespace, model, "failure").inc()

    def forget(self, namespace: str, model: str) -> None:
        for gauge in (self.desired, self.ready, self.activating):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, model)

    def pool(self, namespace: str, deployment: str, valid: bool | None) -> None:
        if valid is None:
            with contextlib.suppress(KeyError):
                self.policy_valid.remove(namespace, deployment)
        else:
            self.policy_valid.labels(namespace, deployment).set(1 if valid else 0)
