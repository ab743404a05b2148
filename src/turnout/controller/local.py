"""The local ModelClaim driver (`turnout controller`): claims are files, pools are runtime agents.

Claims live in ``<data_dir>/claims/<name>.json`` (written by ``turnout claim apply -f claim.yaml``; deleting
marks them and the controller finishes the job), statuses in ``<data_dir>/claim-status.json`` and events in
``<data_dir>/claim-events.json`` (both atomic). Pools are listed in a JSON file or the gateway config:
``[{"name", "agent_url", "address", "gpus", "labels", "policy"}]``. Each tick the driver asks every agent for
its engines, runs :func:`turnout.core.reconcile.plan`, applies the actions, then applies each pool's policy
(:mod:`turnout.controller.policy`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import yaml

from turnout.atomic import write_atomic
from turnout.controller.agents import Activity, AgentClient, AgentReport, Refusal, engine_info, pod_view
from turnout.controller.metrics import ControllerMetrics
from turnout.controller.policy import PolicyRunner, PoolTarget
from turnout.controller.status import bound_pod, now_iso, phase_of, rejection, render_status
from turnout.core.claims import ClaimPhase, ClaimSpec, InvalidClaim, candidates, parse_claim_spec
from turnout.core.reconcile import (
    ANNOTATION_PREFIX,
    Activate,
    Annotate,
    ClaimState,
    Deactivate,
    PodState,
    ReleaseFinalizer,
    SetStatus,
    announces,
    event_type,
    parse_route,
    plan,
    rejected,
)
from turnout.upstream.client import UpstreamClient

__all__ = ["ClaimFiles", "LocalController", "Pool", "load_claim_documents"]

log = logging.getLogger("turnout.controller")


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    agent_url: str
    address: str
    gpus: int
    labels: dict[str, str]
    policy: str | None = None  # the pool.aibrix.ai/policy annotation text


def policy_text(value: Any) -> str | None:
    """A policy given as an object (config, pools file) becomes the annotation text it stands for."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def load_pools(path: Path) -> list[Pool]:
    raw = json.loads(path.read_text())
    return [
        Pool(
            p["name"],
            p["agent_url"].rstrip("/"),
            p.get("address", "127.0.0.1"),
            int(p.get("gpus", 1)),
            {str(k): str(v) for k, v in p.get("labels", {}).items()},
            policy_text(p.get("policy")),
        )
        for p in raw
    ]


def load_claim_documents(text: str) -> list[dict[str, Any]]:
    """ModelClaim objects from YAML or JSON (several YAML documents allowed); checks kind and name."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    out = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or doc.get("kind") != "ModelClaim":
            raise InvalidClaim(f"document {i + 1}: kind must be ModelClaim")
        name = (doc.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise InvalidClaim(f"document {i + 1}: metadata.name is required")
        parse_claim_spec(name, doc.get("spec"))  # refuse bad claims before anything is written
        out.append(doc)
    return out


class ClaimFiles:
    EVENTS_KEPT = 200

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "claims"
        self.status_path = data_dir / "claim-status.json"
        self.events_path = data_dir / "claim-events.json"

    def apply(self, doc: dict[str, Any]) -> str:
        """Create or update; a new claim (or one re-created after a delete) gets a new uid."""
        name = doc["metadata"]["name"]
        path = self.dir / f"{name}.json"
        uid = None
        if path.exists():
            old = orjson.loads(path.read_bytes())
            uid = None if old.get("deleting") else old.get("metadata", {}).get("uid")
        meta = {**doc["metadata"], "uid": uid or uuid.uuid4().hex}
        write_atomic(path, orjson.dumps({**doc, "metadata": meta, "deleting": False}))
        return str(name)

    def mark_deleted(self, name: str) -> bool:
        path = self.dir / f"{name}.json"
        if not path.exists():
            return False
        doc = orjson.loads(path.read_bytes())
        write_atomic(path, orjson.dumps({**doc, "deleting": True}))
        return True

    def remove(self, name: str) -> None:
        (self.dir / f"{name}.json").unlink(missing_ok=True)

    def read(self, name: str) -> dict[str, Any] | None:
        """The stored claim ``name``, or None."""
        data: dict[str, Any] | None = self._read(self.dir / f"{name}.json", None)
        return data

    def all(self) -> list[dict[str, Any]]:
        if not self.dir.is_dir():
            return []
        return [orjson.loads(p.read_bytes()) for p in sorted(self.dir.glob("*.json"))]

    def _read(self, path: Path, empty: Any) -> Any:
        try:
            return orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return empty

    def statuses(self) -> dict[str, dict[str, Any]]:
        data: dict[str, dict[str, Any]] = self._read(self.status_path, {})
        return data

    def save_statuses(self, statuses: dict[str, dict[str, Any]]) -> None:
        write_atomic(self.status_path, orjson.dumps(statuses, option=orjson.OPT_INDENT_2))

    def events(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self._read(self.events_path, [])
        return data

    def save_events(self, events: list[dict[str, Any]]) -> None:
        write_atomic(self.events_path, orjson.dumps(events[-self.EVENTS_KEPT :], option=orjson.OPT_INDENT_2))


class LocalController:
    """Reconciles claim files against runtime agents. Owns the statuses in memory; saves them each tick."""

    def __init__(
        self,
        files: ClaimFiles,
        pools: list[Pool],
        client: UpstreamClient,
        *,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.files = files
        self.pools = {p.name: p for p in pools}
        self.agents = AgentClient(client)
        self.metrics = metrics or ControllerMetrics()
        self.policy = PolicyRunner(self.agents, self.metrics)
        self.clock = clock
        self.statuses = files.statuses()
        self.events = files.events()
        self.annotations: dict[str, dict[str, str]] = {p.name: {} for p in pools}
        self.reports: dict[str, dict[str, dict[str, Any]]] = {}  # pool -> model -> engine as last reported
        self.on_route_change: Callable[[], None] | None = None  # the gateway re-reads routes at once
        self.activity: Callable[[str], Activity | None] = lambda claim: None  # gateway-counted requests
        self._events_dirty = False
        self.uids: dict[str, str] = {}
        self.specs: dict[str, ClaimSpec] = {}  # this tick's valid specs, by claim
        self.candidates: dict[str, int] = {}  # claim -> pool pods it could run on, as of the last tick

    async def tick(self) -> None:
        docs = self.files.all()
        claims = []
        models: dict[str, str] = {}
        self.specs = {}
        self.uids = {d["metadata"]["name"]: str(d["metadata"].get("uid", "")) for d in docs}
        for doc in docs:
            name = doc["metadata"]["name"]
            try:
                spec, invalid = parse_claim_spec(name, doc.get("spec")), None
            except InvalidClaim as exc:
                spec, invalid = None, str(exc)
            models[name] = spec.model_name if spec is not None else name
            if spec is not None:
                self.specs[name] = spec
            status = self.statuses.get(name)
            bound = bound_pod(status)
            refused = rejection(status, spec)
            claims.append(ClaimState(name, spec, invalid, bound, bool(doc.get("deleting")), refused))
        pools = list(self.pools.values())
        reports = await asyncio.gather(*(self.agents.report(p.agent_url, p.name) for p in pools))
        self.reports = {
            p.name: {str(e["model_name"]): e for e in (r.engines if r else [])}
            for p, r in zip(pools, reports, strict=True)
        }
        pods = [self._pod_state(p, r) for p, r in zip(pools, reports, strict=True)]
        views = [p.pod for p in pods]
        self.candidates = {c.name: candidates(c.spec, views) if c.spec is not None else 0 for c in claims}
        last: dict[str, SetStatus] = {}  # claim -> the status this tick set so far (an activation's port follows)
        for action in plan(claims, pods):
            if isinstance(action, SetStatus):
                last[action.claim] = action
            await self._apply(action, models, last)
        live = {c.name for c in claims if not c.deleting and c.spec is not None}
        for pool, report in zip(pools, reports, strict=True):
            if report is not None:
                await self._pool_policy(pool, report, live, models)
        self.files.save_statuses(self.statuses)
        if self._events_dirty:
            self.files.save_events(self.events)
            self._events_dirty = False

    def _pod_state(self, pool: Pool, report: AgentReport | None) -> PodState:
        view = pod_view(pool.name, pool.labels, True, pool.address, pool.gpus, report)
        if report is None:
            return PodState(view, {}, reachable=False)
        return PodState(view, {str(e["model_name"]): engine_info(e) for e in report.engines})

    async def _pool_policy(self, pool: Pool, report: AgentReport, live: set[str], models: dict[str, str]) -> None:
        bound = {models[c]: c for c in live if self.statuses.get(c, {}).get("pod") == pool.name}
        target = PoolTarget(
            pool.name,
            pool.agent_url,
            pool.gpus,
            pool.policy,
            report.engines,
            bound,
            "local",
            pool.name,
            report.accelerators,
        )

        async def set_route(claim: str, value: str) -> None:
            self._annotate(pool.name, ANNOTATION_PREFIX + claim, value)
            sleeping = json.loads(value)["state"] == "sleeping"
            # the same status the plan gives a sleeping engine: the IdleSleep event is the policy's own
            phase, reason = (ClaimPhase.SLEEPING, "Sleeping") if sleeping else (ClaimPhase.ACTIVE, "Ready")
            engine_port = int(self.reports[pool.name][models[claim]]["port"])
            port = 0 if sleeping else engine_port
            self._set_status(SetStatus(claim, phase, reason, "", pool.name, port, engine_port), models[claim])
            if self.on_route_change is not None:
                self.on_route_change()

        async def event(claim: str | None, kind: str, reason: str, message: str) -> None:
            self._event(f"ModelClaim/{claim}" if claim else f"Pool/{pool.name}", kind, reason, message)

        await self.policy.step(target, self.clock(), set_route=set_route, event=event, activity=self.activity)

    def _annotate(self, pod: str, key: str, value: str | None) -> None:
        notes = self.annotations.setdefault(pod, {})
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value

    def _event(self, obj: str, kind: str, reason: str, message: str) -> None:
        """Record an event; a repeat of one already kept (same object, type, reason and message) is that event
        again, counted, moved to the end with its new last time (as Kubernetes aggregates Events)."""
        now = now_iso(self.clock())
        key = (obj, kind, reason, message)
        same = next(
            (i for i, e in enumerate(self.events) if (e["object"], e["type"], e["reason"], e["message"]) == key), None
        )
        if same is not None:
            event = self.events.pop(same)
            event["count"] += 1
            event["lastTimestamp"] = now
            self.events.append(event)
        else:
            self.events.append(
                {
                    "object": obj,
                    "type": kind,
                    "reason": reason,
                    "message": message,
                    "count": 1,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                }
            )
        self._events_dirty = True

    def _set_status(self, action: SetStatus, model: str) -> None:
        previous = self.statuses.get(action.claim, {})
        before = phase_of(previous)
        if announces(before, previous.get("reason"), action):
            log.info("claim %s: %s -> %s (%s)", action.claim, before, action.phase.value, action.reason)
            kind = event_type(action)
            self._event(f"ModelClaim/{action.claim}", kind, action.reason, action.message or action.phase.value)
        spec = self.specs.get(action.claim)
        count = self.candidates.get(action.claim, 0)
        now = now_iso(self.clock())
        self.statuses[action.claim] = render_status(action, previous, now, model, spec, candidates=count)
        self.metrics.claim("local", model, before, action.phase)

    async def _apply(self, action: object, models: dict[str, str], last: dict[str, SetStatus] | None = None) -> None:
        if isinstance(action, SetStatus):
            self._set_status(action, models[action.claim])
        elif isinstance(action, Activate):
            pool = self.pools[action.pod]
            ref = {"namespace": "local", "name": action.claim, "uid": self.uids.get(action.claim, "")}
            result = await self.agents.activate(pool.agent_url, pool.name, action.spec, ref)
            placed = (last or {}).get(action.claim)
            if isinstance(result, Refusal) and result.invalid:  # terminal: Failed, no retry (see core.reconcile)
                for step in rejected(action.claim, action.pod, action.spec.model_name, result.detail):
                    await self._apply(step, models)
            elif isinstance(result, Refusal):
                self._event(f"ModelClaim/{action.claim}", "Warning", "ActivateFailed", result.message)
            elif result and placed is not None and placed.pod == action.pod:  # the engine's port, known from now on
                self._set_status(replace(placed, engine_port=result), models[action.claim])
        elif isinstance(action, Deactivate):
            pool = self.pools[action.pod]
            await self.agents.post(
                pool.agent_url, pool.name, "/v1/runtime/models/deactivate", {"model_name": action.model}
            )
        elif isinstance(action, Annotate):
            before = self.annotations.get(action.pod, {}).get(action.key)
            self._annotate(action.pod, action.key, action.value)
            if before != action.value and self.on_route_change is not None:
                self.on_route_change()
        elif isinstance(action, ReleaseFinalizer):
            self.files.remove(action.claim)
            self.statuses.pop(action.claim, None)
            self.metrics.forget("local", models[action.claim])
            self._event(f"ModelClaim/{action.claim}", "Normal", "Deleted", "engine stopped and route removed")

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # one bad tick must not end reconciliation
                log.exception("reconcile tick failed")
            await asyncio.sleep(interval_s)

    def phase(self, claim: str) -> ClaimPhase | None:
        return phase_of(self.statuses.get(claim))

    def annotation(self, claim: str) -> str | None:
        """The claim's routing annotation on its pod, if any."""
        pod = self.statuses.get(claim, {}).get("pod")
        return self.annotations.get(pod or "", {}).get(ANNOTATION_PREFIX + claim)

    def route(self, claim: str) -> tuple[Pool, int] | None:
        """Where the claim's engine is routable now (its routing annotation has a port), or None."""
        pod = self.statuses.get(claim, {}).get("pod")
        port, _state = parse_route(self.annotation(claim))
        return (self.pools[pod], port) if port and pod in self.pools else None
