"""Talking to runtime agents, shared by the local and Kubernetes drivers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from turnout.core.lifecycle import EngineObservation
from turnout.core.reconcile import EngineInfo
from turnout.errors import UpstreamError
from turnout.upstream.client import UpstreamClient

__all__ = ["Activity", "AgentClient", "engine_info", "observation"]

log = logging.getLogger("turnout.controller")

Activity = tuple[int, int]  # (in flight, completed so far) as the gateway counted them


class AgentClient:
    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    async def engines(self, agent_url: str, label: str) -> list[dict[str, Any]] | None:
        """The agent's engines, or None when it does not answer."""
        try:
            body = await self.client.get_json(f"{agent_url}/v1/runtime/models", label=label, timeout_s=5)
        except UpstreamError:
            return None
        models = body.get("models") if isinstance(body, dict) else None
        return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else None

    async def post(self, agent_url: str, label: str, path: str, body: Mapping[str, Any]) -> str | None:
        """POST an operation; None when it worked, else what went wrong (for logs, events and statuses)."""
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
                    return None
                problem = f"HTTP {r.status}: {_message(raw)}"
        except UpstreamError as exc:
            problem = exc.message
        log.warning("%s %s failed: %s", label, path, problem)
        return problem


def _message(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
        return str(body.get("error", {}).get("message") or body)
    except (orjson.JSONDecodeError, AttributeError):
        return raw[:200].decode("utf-8", "replace")


def engine_info(engine: Mapping[str, Any]) -> EngineInfo:
    return EngineInfo(str(engine["phase"]), bool(engine["ready"]), int(engine["port"]), engine.get("last_error"))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def observation(claim: str, engine: Mapping[str, Any], activity: Activity | None) -> EngineObservation:
    """What the pool policy sees of one engine. Request counts come from the engine's metrics (as the agent
    reports them) or, where the engine exports none, from the gateway's own count of requests it sent there."""
    requests = engine.get("requests") or {}
    running, waiting, done = (_int(requests.get(k)) for k in ("running", "waiting", "success_total"))
    if (running is None or waiting is None or done is None) and activity is not None:
        running, waiting, done = activity[0], 0, activity[1]
    return EngineObservation(
        claim=claim,
        model=str(engine["model_name"]),
        phase=str(engine["phase"]),
        ready=bool(engine["ready"]),
        kv_used_bytes=_int(engine.get("kv_used_bytes")),
        kv_prealloc_bytes=_int(engine.get("kv_prealloc_bytes")) or 0,
        kv_capacity_bytes=_int(engine.get("kv_capacity_bytes")),
        running=running,
        waiting=waiting,
        success_total=done,
    )
