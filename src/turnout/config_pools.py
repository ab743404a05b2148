"""The ``pools`` section of ``config.json``: GPU runtime pools, driven by the in-process ModelClaim controller
(agents listed here, claims in the data dir) or read from a Kubernetes cluster whose claims ``turnout operator``
reconciles. Part of :mod:`turnout.config` (which holds the other sections and the loader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import AnyHttpUrl, Field, model_validator

from turnout.config_base import MAX_WAIT_S
from turnout.config_base import Model as _Model

__all__ = ["PoolAgent", "Pools", "PoolsKubernetes"]


class PoolAgent(_Model):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    agent_url: AnyHttpUrl = Field(description="the pod's runtime agent (turnout agent)")
    address: str = Field("127.0.0.1", description="address engines on this pod are reached at")
    gpus: int = Field(1, ge=1, le=256)
    labels: dict[str, str] = Field(default_factory=dict, description="matched by ModelClaim podSelector")
    policy: dict[str, Any] | str | None = Field(
        None,
        description="pool policy, as the pool.aibrix.ai/policy annotation would carry it: "
        '{"reclaim": {"mode": "kv-first", "capacityBytes": N, "guaranteedFloorPercent": P}, '
        '"lifecycle": {"sleepAfterSeconds": S, "sleepByStop": B}}; checked strictly by the controller (invalid = '
        "disabled + event)",
    )


class PoolsKubernetes(_Model):
    """Claims reconciled by `turnout operator` in a cluster; the gateway only reads them."""

    namespaces: list[str] = Field(default_factory=list, description="namespaces to read claims from; empty = all")
    kubeconfig: Path | None = Field(None, description="kubeconfig file; none = in-cluster service account")


class Pools(_Model):
    """GPU runtime pools: either agents driven by the in-process local ModelClaim controller (claims in the
    data dir), or a Kubernetes cluster whose claims `turnout operator` reconciles."""

    agents: list[PoolAgent] = Field(default_factory=list)
    kubernetes: PoolsKubernetes | None = None
    interval_s: float = Field(
        2.0, gt=0, le=MAX_WAIT_S, description="seconds between reconcile ticks (or reads of the cluster)"
    )

    @model_validator(mode="after")
    def _one_driver(self) -> Self:
        if self.agents and self.kubernetes is not None:
            raise ValueError("set pools.agents (local controller) or pools.kubernetes (operator), not both")
        names = [a.name for a in self.agents]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate pool agent name(s) {duplicates}: each pool pod needs its own name")
        return self
