"""The Runtime pools page: pools and their pods, the engines each runs (phase, port, restarts, last error, KV
cache used / capacity), ModelClaims with their phase, and the controller's claim events.

Claims and their phases are what ``GET /admin/api/claims`` answers (:func:`turnout.admin.api.claims`: the
phase after the route's own state, where it routes, whether it serves). With the in-process local controller
(``pools.agents``) the page adds what that controller holds from its last tick: each pool's agent, the engines
its snapshot reported, each claim's status (reason, message, pod, port, since) and the events it recorded
(``claim-events.json``). With ``pools.kubernetes`` the pods, engines and events belong to the operator and
the cluster (``kubectl get modelclaims``, ``kubectl get events``); the page shows the claims as this gateway
routes them. The body is a fragment the page polls (``/admin/pools/fragment``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from turnout.admin.api import claims
from turnout.admin.ui.answers import answer
from turnout.admin.ui.display import iso, size, when, when_iso
from turnout.admin.ui.render import page, render
from turnout.controller.claim_sources import LocalSource
from turnout.gateway.keys import PROXY

__all__ = ["EVENTS_SHOWN", "POLL_S", "add_pools_routes", "pools_state"]

POLL_S = 5
EVENTS_SHOWN = 50  # the newest events (the local controller keeps 200)


def _int(value: Any) -> int | None:
    """A figure, or None when absent or unknown (AIBrix's KV_UNKNOWN, -1, which agents send for an engine whose
    KV cache cannot be read: llama.cpp's)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _engine(engine: dict[str, Any]) -> dict[str, Any]:
    ref = engine.get("claim_ref")
    return {
        "model": str(engine.get("model_name", "")),
        "engine": engine.get("engine"),
        "claim": ref.get("name") if isinstance(ref, dict) else None,
        "phase": str(engine.get("phase", "")),
        "ready": bool(engine.get("ready")),
        "port": _int(engine.get("port")),
        "restarts": _int(engine.get("restart_count")) or 0,
        "last_error": engine.get("last_error"),
        "kv_used": _int(engine.get("kv_used_bytes")),
        "kv_capacity": _int(engine.get("kv_capacity_bytes")),
        "since": _epoch(engine.get("last_transition")),
    }


def _epoch(value: Any) -> float | None:
    """An engine's ``last_transition`` (RFC 3339, as AIBrix's snapshot writes it) as a timestamp."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


async def pools_state(request: web.Request) -> dict[str, Any]:
    listed = await answer(claims, request)
    bindings = request.app[PROXY].claims
    local = bindings.source.controller if bindings is not None and isinstance(bindings.source, LocalSource) else None
    statuses: dict[str, dict[str, Any]] = dict(local.statuses) if local is not None else {}
    rows = []
    for claim in listed["claims"]:
        status = statuses.get(claim["claim"], {})
        rows.append(
            {
                **claim,
                "reason": status.get("reason"),
                "message": status.get("message"),
                "pod": status.get("pod"),
                "port": status.get("port") or None,
                "since": status.get("lastTransitionTime"),
            }
        )
    pools = []
    events: list[dict[str, Any]] = []
    if local is not None:
        for pool in local.pools.values():
            reported = local.reports.get(pool.name, {})
            pools.append(
                {
                    "name": pool.name,
                    "agent_url": pool.agent_url,
                    "address": pool.address,
                    "gpus": pool.gpus,
                    "labels": sorted(pool.labels.items()),
                    "policy": pool.policy,
                    "engines": [_engine(e) for _, e in sorted(reported.items())],
                }
            )
        events = list(reversed(local.events[-EVENTS_SHOWN:]))
    return {
        "configured": listed["configured"],
        "driver": "local" if local is not None else ("kubernetes" if bindings is not None else None),
        "claims": rows,
        "pools": pools,
        "events": events,
        "wakes_sent": listed.get("wakes_sent", 0),
        "poll_s": POLL_S,
        "when": when,
        "when_iso": when_iso,
        "iso": iso,
        "size": size,
    }


@page
async def pools_page(request: web.Request) -> web.StreamResponse:
    return render(request, "pools.html", active="ui.pools", **await pools_state(request))


@page
async def pools_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_pools_body.html", **await pools_state(request))


def add_pools_routes(app: web.Application) -> None:
    app.router.add_get("/admin/pools", pools_page, name="ui.pools")
    app.router.add_get("/admin/pools/fragment", pools_fragment, name="ui.pools.fragment")
