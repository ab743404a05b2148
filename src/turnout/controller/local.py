"""The local ModelClaim driver (`turnout controller`): claims are files, pools are runtime agents.

Claims live in ``<data_dir>/claims/<name>.json`` (written by ``turnout claim apply -f claim.yaml``; deleting
marks them and the controller finishes the job), statuses in ``<data_dir>/claim-status.json`` (atomic).
Pools are listed in a JSON file: ``[{"name", "agent_url", "address", "gpus", "labels"}]``. Each tick the
driver asks every agent for its engines, runs :func:`turnout.core.reconcile.plan` and applies the actions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from turnout.core.claims import ClaimPhase, InvalidClaim, PodView, parse_claim_spec
from turnout.core.reconcile import (
    Activate,
    Annotate,
    ClaimState,
    Deactivate,
    EngineInfo,
    PodState,
    ReleaseFinalizer,
    SetStatus,
    plan,
)
from turnout.errors import UpstreamError
from turnout.state.atomic import write_atomic
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


def load_pools(path: Path) -> list[Pool]:
    raw = json.loads(path.read_text())
    return [
        Pool(
            p["name"],
            p["agent_url"].rstrip("/"),
            p.get("address", "127.0.0.1"),
            int(p.get("gpus", 1)),
            {str(k): str(v) for k, v in p.get("labels", {}).items()},
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
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "claims"
        self.status_path = data_dir / "claim-status.json"

    def apply(self, doc: dict[str, Any]) -> str:
        name = doc["metadata"]["name"]
        write_atomic(self.dir / f"{name}.json", orjson.dumps({**doc, "deleting": False}))
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

    def all(self) -> list[dict[str, Any]]:
        if not self.dir.is_dir():
            return []
        return [orjson.loads(p.read_bytes()) for p in sorted(self.dir.glob("*.json"))]

    def statuses(self) -> dict[str, dict[str, Any]]:
        try:
            data: dict[str, dict[str, Any]] = orjson.loads(self.status_path.read_bytes())
            return data
        except FileNotFoundError:
            return {}

    def save_statuses(self, statuses: dict[str, dict[str, Any]]) -> None:
        write_atomic(self.status_path, orjson.dumps(statuses, option=orjson.OPT_INDENT_2))


class LocalController:
    def __init__(self, files: ClaimFiles, pools: list[Pool], client: UpstreamClient) -> None:
        self.files = files
        self.pools = {p.name: p for p in pools}
        self.client = client
        self.annotations: dict[str, dict[str, str]] = {p.name: {} for p in pools}

    async def tick(self) -> None:
        docs = self.files.all()
        statuses = self.files.statuses()
        claims = []
        for doc in docs:
            name = doc["metadata"]["name"]
            try:
                spec, invalid = parse_claim_spec(name, doc.get("spec")), None
            except InvalidClaim as exc:
                spec, invalid = None, str(exc)
            claims.append(ClaimState(name, spec, invalid, statuses.get(name, {}).get("pod"), bool(doc.get("deleting"))))
        pods = await asyncio.gather(*(self._pod_state(p) for p in self.pools.values()))
        for action in plan(claims, pods):
            await self._apply(action, statuses)
        self.files.save_statuses(statuses)

    async def _pod_state(self, pool: Pool) -> PodState:
        view = PodView(pool.name, pool.labels, True, pool.address, pool.gpus)
        try:
            body = await self.client.get_json(f"{pool.agent_url}/v1/runtime/models", label=pool.name, timeout_s=5)
        except UpstreamError:
            return PodState(view, {}, reachable=False)
        engines = {
            e["model_name"]: EngineInfo(e["phase"], bool(e["ready"]), int(e["port"]), e.get("last_error"))
            for e in body.get("models", [])
        }
        return PodState(PodView(pool.name, pool.labels, True, pool.address, pool.gpus, models=len(engines)), engines)

    async def _apply(self, action: object, statuses: dict[str, dict[str, Any]]) -> None:
        if isinstance(action, SetStatus):
            previous = statuses.get(action.claim, {})
            if previous.get("phase") != action.phase.value:
                log.info(
                    "claim %s: %s -> %s (%s)", action.claim, previous.get("phase"), action.phase.value, action.reason
                )
            statuses[action.claim] = {
                "phase": action.phase.value,
                "reason": action.reason,
                "message": action.message,
                "pod": action.pod,
                "port": action.port,
                "lastTransitionTime": previous.get("lastTransitionTime")
                if previous.get("phase") == action.phase.value
                else time.time(),
            }
        elif isinstance(action, Activate):
            pool = self.pools[action.pod]
            body = {
                "model_name": action.spec.model_name,
                "artifact_url": action.spec.artifact_url,
                "engine": action.spec.engine,
                "engine_config": {"args": dict(action.spec.args)},
                "claim_ref": {"namespace": "local", "name": action.claim},
                "operation_id": f"activate-{action.claim}-{action.pod}",
            }
            await self._post(pool, "/v1/runtime/models/activate", body)
        elif isinstance(action, Deactivate):
            await self._post(self.pools[action.pod], "/v1/runtime/models/deactivate", {"model_name": action.model})
        elif isinstance(action, Annotate):
            notes = self.annotations.setdefault(action.pod, {})
            if action.value is None:
                notes.pop(action.key, None)
            else:
                notes[action.key] = action.value
        elif isinstance(action, ReleaseFinalizer):
            self.files.remove(action.claim)
            statuses.pop(action.claim, None)

    async def _post(self, pool: Pool, path: str, body: dict[str, Any]) -> None:
        try:
            async with self.client.request(
                "POST",
                pool.agent_url + path,
                label=pool.name,
                body=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout_s=30,
            ) as r:
                await r.read()
                if r.status >= 300:
                    log.warning("%s %s: HTTP %s", pool.name, path, r.status)
        except UpstreamError as exc:
            log.warning("%s %s failed: %s", pool.name, path, exc.message)

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # one bad tick must not end reconciliation
                log.exception("reconcile tick failed")
            await asyncio.sleep(interval_s)

    def phase(self, claim: str) -> ClaimPhase | None:
        value = self.files.statuses().get(claim, {}).get("phase")
        return None if value is None else ClaimPhase(value)
