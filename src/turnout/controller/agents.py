"""Talking to runtime agents, shared by the local and Kubernetes drivers."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from turnout.core.claims import ClaimSpec, PodView, artifact_key
from turnout.core.lifecycle import EngineObservation
from turnout.core.reconcile import EngineInfo, download_detail, launch_key
from turnout.core.runtime import sleeps_in_place
from turnout.core.snapshot import known, read_snapshot
from turnout.errors import UpstreamError
from turnout.upstream.client import UpstreamClient

__all__ = ["Activity", "AgentClient", "AgentReport", "Refusal", "engine_info", "observation", "pod_view", "spec_digest"]

log = logging.getLogger("turnout.controller")

Activity = tuple[int, int]  # (in flight, completed so far) as the gateway counted them


@dataclass(frozen=True, slots=True)
class AgentReport:
    """One agent snapshot: its engines (AIBrix's snapshot models), the artifacts its pod has cached
    (:func:`artifact_key` names), the free device memory (NVML) and how many GPUs it reports (0: none, a CPU pod
    or no NVML)."""

    engines: list[dict[str, Any]]
    cached: frozenset[str] = frozenset()
    free_hbm_bytes: int | None = None
    accelerators: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an agent operation did not happen: the agent's answer (``status``) or, when it did not answer, None."""

    status: int | None
    detail: str

    @property
    def invalid(self) -> bool:
        """The agent refused the request itself (HTTP 400): sending the same request again cannot help."""
        return self.status == 400

    @property
    def message(self) -> str:
        return self.detail if self.status is None else f"HTTP {self.status}: {self.detail}"


class AgentClient:
    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    async def report(self, agent_url: str, label: str) -> AgentReport | None:
        """The agent's snapshot, or None when it does not answer."""
        try:
            body = await self.client.get_json(f"{agent_url}/v1/runtime/snapshot", label=label, timeout_s=5)
        except UpstreamError:
            return None
        snapshot = read_snapshot(body)  # a Turnout agent's or an AIBrix runtime's, in AIBrix's names
        if snapshot is None:
            return None
        return AgentReport(
            snapshot.models,
            frozenset(artifact_key(k) for k in snapshot.cached_artifacts),
            snapshot.free_hbm_bytes,
            len(snapshot.accelerators),
        )

    async def post(self, agent_url: str, label: str, path: str, body: Mapping[str, Any]) -> str | None:
        """POST an operation; None when it worked, else what went wrong (for logs, events and statuses)."""
        refusal = await self.call(agent_url, label, path, body)
        return None if refusal is None else refusal.message

    async def call(self, agent_url: str, label: str, path: str, body: Mapping[str, Any]) -> Refusal | None:
        """POST an operation; None when it worked, else the :class:`Refusal`."""
        result = await self._send(agent_url, label, path, body)
        return result if isinstance(result, Refusal) else None

    async def _send(self, agent_url: str, label: str, path: str, body: Mapping[str, Any]) -> Refusal | bytes:
        """POST an operation; the answer's body when it worked, else the :class:`Refusal`."""
        try:
            async with self.client.request(
                "POST",
                agent_url + path,
                label=label,
                body=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout_s=120,
            ) as r:
                raw = await r.read()
                if r.status < 300:
                    return raw
                refusal = Refusal(r.status, _message(raw))
        except UpstreamError as exc:
            refusal = Refusal(None, exc.message)
        log.warning("%s %s failed: %s", label, path, refusal.message)
        return refusal

    async def activate(self, agent_url: str, pod: str, spec: ClaimSpec, claim_ref: Mapping[str, str]) -> Refusal | int:
        """Start the claim's engine on the pod; a repeat is a no-op (activation is idempotent by model name).
        The engine's port from the answer (AIBrix's ``ActivateRuntimeModelResponse.port``; 0 when it has none),
        else the :class:`Refusal`."""
        body = {  # AIBrix's ActivateRuntimeModelRequest: an AIBrix runtime refuses any other field
            "model_name": spec.model_name,
            "artifact_url": spec.artifact_url,
            "engine": spec.engine,
            "engine_config": {"args": dict(spec.args)},
            # AIBrix's RuntimeClaimRef needs namespace, name and uid
            "claim_ref": {k: str(claim_ref.get(k) or "") for k in ("namespace", "name", "uid")},
        }  # no operation_id: AIBrix's runtime has none for activation
        result = await self._send(agent_url, pod, "/v1/runtime/models/activate", body)
        return result if isinstance(result, Refusal) else _port(result)


def spec_digest(spec: ClaimSpec) -> str:
    raw = orjson.dumps([spec.model_name, *launch_key(spec)])
    return hashlib.sha256(raw).hexdigest()[:12]


def _port(raw: bytes) -> int:
    try:
        port = orjson.loads(raw).get("port")
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else 0


def _message(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
        return str(body.get("error", {}).get("message") or body)
    except (orjson.JSONDecodeError, AttributeError):
        return raw[:200].decode("utf-8", "replace")


def engine_info(engine: Mapping[str, Any], namespace: str = "local") -> EngineInfo:
    """The plan's view of one reported engine; its claim is named only when it is from ``namespace``."""
    args = engine.get("args")
    launched = None
    if isinstance(args, dict) and "engine" in engine and "artifact_url" in engine:
        launched = (
            str(engine["engine"]),
            str(engine["artifact_url"]),
            tuple(sorted((str(k), str(v)) for k, v in args.items())),
        )
    ref = engine.get("claim_ref") or {}
    return EngineInfo(
        str(engine["phase"]),
        bool(engine["ready"]),
        int(engine["port"]),
        engine.get("last_error"),
        launched,
        str(ref["name"]) if isinstance(ref, dict) and ref.get("name") and ref.get("namespace") == namespace else None,
        download_detail(engine.get("download")),
    )


def observation(claim: str, engine: Mapping[str, Any], activity: Activity | None) -> EngineObservation:
    """What the pool policy sees of one engine. Request counts come from the engine's metrics (as the agent
    reports them) or, where the engine exports none, from the gateway's own count of requests it sent there."""
    running = waiting = done = None
    if engine.get("request_metrics_observed"):
        running, waiting = known(engine.get("requests_running")), known(engine.get("requests_waiting"))
        done = known(engine.get("request_success_total"))
    if (running is None or waiting is None or done is None) and activity is not None:
        running, waiting, done = activity[0], 0, activity[1]
    return EngineObservation(
        claim=claim,
        model=str(engine["model_name"]),
        phase=str(engine["phase"]),
        ready=bool(engine["ready"]),
        kv_used_bytes=known(engine.get("kv_used_bytes")),
        kv_prealloc_bytes=known(engine.get("kv_prealloc_bytes")) or 0,
        kv_capacity_bytes=known(engine.get("kv_capacity_bytes")),
        running=running,
        waiting=waiting,
        success_total=done,
        in_place_sleep=_sleeps_in_place(engine),
        engine=str(engine.get("engine") or ""),
    )


def _sleeps_in_place(engine: Mapping[str, Any]) -> bool:
    args = engine.get("args")
    flags = {str(k): str(v) for k, v in args.items()} if isinstance(args, dict) else {}
    return sleeps_in_place(str(engine.get("engine", "")), flags)


def pod_view(
    name: str, labels: Mapping[str, str], running: bool, address: str | None, gpus: int, report: AgentReport | None
) -> PodView:
    """What placement ranks a pod by: cached artifacts (and those its engines run), free HBM, KV used, models,
    load (requests running or waiting where the engines report them)."""
    if report is None:
        return PodView(name, labels, running, address, gpus)
    engines = report.engines
    load = 0
    for e in engines:
        if e.get("request_metrics_observed"):
            load += sum(known(e.get(k)) or 0 for k in ("requests_running", "requests_waiting"))
    return PodView(
        name,
        labels,
        running,
        address,
        gpus,
        free_hbm_bytes=report.free_hbm_bytes,
        kv_used_bytes=sum(known(e.get("kv_used_bytes")) or 0 for e in engines),
        models=len(engines),
        load=float(load),
        cached_artifacts=report.cached | {artifact_key(str(e.get("artifact_url", ""))) for e in engines},
    )
