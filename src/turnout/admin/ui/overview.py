"""The Overview page: where proxied requests' time went over the last minutes, workers and endpoints with health
(and why when down), models, load, requests per minute, each worker's prefix cache hit rate and what its engine runs
at once (and how that was found), the requests waiting and running by priority class and in flight per worker
(every process's of `serve --workers N`, as ``/metrics`` has them: :mod:`turnout.gateway.process_metrics`), and
ModelClaims by phase. The body is a fragment
(``/admin/overview/fragment``) that the page polls with htmx, so it refreshes itself without a reload.

Requests per minute come from the usage store (all replicas' traffic, flushed first): the requests of the
previous and the current minute, scaled to one minute. Where the time went comes from this replica's counts (every
process's of `serve --workers N`; :mod:`turnout.phase_stats`: the median and 90th percentile of each phase over the
last 5 or 15 minutes, ``?window=15``), drawn as bars a person takes in at a glance, the numbers beside them.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from aiohttp import web

from turnout.admin.ui.display import ms, number, when
from turnout.admin.ui.render import page, render
from turnout.core.priority import CLASSES
from turnout.gateway.keys import ACCOUNTANT, DISPATCHER, ENDPOINTS, FLEET, METRICS, PROXY, USAGE
from turnout.gateway.process_metrics import PROCESS_GROUP, every_process_families, every_process_phases
from turnout.gateway.redis_occupancy import RedisOccupancy
from turnout.phase_stats import VIEWS, summarize

__all__ = ["POLL_S", "WINDOWS", "add_overview_routes", "overview_state"]

POLL_S = 5  # the page refreshes its body this often
WINDOWS = (5, 15)  # minutes the timing panel looks back (the first: unless ?window= says another)
_BAR = 240.0  # the bars' full width (SVG units): the longest 90th percentile shown


def _window(request: web.Request) -> int:
    asked = request.query.get("window", "")
    return next((w for w in WINDOWS if str(w) == asked), WINDOWS[0])


async def _timing(request: web.Request, minutes: int) -> dict[str, Any]:
    """Each phase's median and 90th percentile over the last ``minutes`` (every process's requests), with bar
    lengths on one scale."""
    recent = summarize(await every_process_phases(request.app, minutes))
    longest = max((float(row["p90"] or 0.0) for row in recent.values()), default=0.0)
    rows = []
    for view, _, _ in VIEWS:
        row = recent[view]
        p50, p90 = row["p50"], row["p90"]
        rows.append(
            {
                "view": view,
                "count": number(int(row["count"] or 0)),
                "p50": ms(p50),
                "p90": ms(p90),
                # at least a sliver for a phase that took any time at all, so that it shows
                "w50": 0.0 if p50 is None or not longest else max(round(float(p50) / longest * _BAR, 1), 0.5),
                "w90": 0.0 if p90 is None or not longest else max(round(float(p90) / longest * _BAR, 1), 0.5),
                "seen": bool(row["count"]),
            }
        )
    answered = int(recent["total_whole"]["count"] or 0) + int(recent["total_stream"]["count"] or 0)
    return {"minutes": minutes, "windows": WINDOWS, "rows": rows, "answered": answered, "bar": _BAR}


async def _requests_per_min(request: web.Request, now: float) -> tuple[dict[str, float], float]:
    start = (now // 60 - 1) * 60
    await request.app[ACCOUNTANT].usage.flush()
    rows = await asyncio.to_thread(request.app[USAGE].summary, since=start, bucket="hour")
    span_min = max(1.0, (now - start) / 60)
    per: Counter[str] = Counter()
    for row in rows:
        per[row["worker"] or row["endpoint"]] += row["requests"]
    total = sum(per.values())
    return {k: round(v / span_min, 1) for k, v in per.items()}, round(total / span_min, 1)


async def overview_state(request: web.Request) -> dict[str, Any]:
    fleet = request.app[FLEET]
    rpm, rpm_total = await _requests_per_min(request, time.time())
    classes, in_flight = await _counts(request)
    since = {e["name"]: e.get("state_since") for e in request.app[ENDPOINTS].describe()}
    workers, endpoints = [], []
    for state in fleet.workers.values():
        row = {
            "name": state.name,
            "type": state.config.type.value,
            "url": state.config.base_url,
            "healthy": state.healthy,
            "checked": state.checked,
            "why": state.last_error,
            "models_out": state.models_out(time.monotonic()),
            "native_apis": sorted(state.native_apis),
            "installed": None if state.inventory is None else len(state.inventory),
            "inventory_error": state.inventory_error if state.inventory_stale else None,
            "loaded": sorted(state.loaded),
            "in_flight": in_flight.get(state.name, state.in_flight),
            "max_concurrent": state.config.max_concurrent,
            "rpm": rpm.get(state.name, 0.0),
            # the share of prompt tokens served from its engine's cache: the engine's count, else the index's
            "hit_rate": state.hit_rate,
            "hit_source": "engine" if state.engine_prompt_tokens else "index",
            # what its engine runs at once, per model, and how that was found (turnout.core.parallelism)
            "parallelism": {m: p.to_json() for m, p in state.parallelisms(time.monotonic()).items()},
        }
        if state.external is not None:
            ext = state.external
            row |= {
                "state": ext.state.value,
                "hint": ext.hint,
                "latency_ms": ext.latency_ms,
                "since": when(since.get(state.name)),
            }
            endpoints.append(row)
        elif state.claim is None:
            workers.append(row)
    bindings = request.app[PROXY].claims
    phases: Counter[str] = Counter()
    if bindings is not None:
        phases.update(view.phase.value for view in bindings.source.views())
    return {
        "timing": await _timing(request, _window(request)),
        "workers": workers,
        "endpoints": endpoints,
        "classes": classes,
        "claims_configured": bindings is not None,
        "phases": sorted(phases.items()),
        "in_flight": sum(in_flight.get(s.name, s.in_flight) for s in fleet.workers.values()),
        "rpm_total": rpm_total,
        "workers_up": sum(1 for w in workers if w["healthy"]),
        "endpoints_up": sum(1 for e in endpoints if e["healthy"]),
        "poll_s": POLL_S,
        "shared": _shared_state(request),
    }


_CLASS_FAMILIES = {"turnout_priority_waiting_requests": "waiting", "turnout_priority_running_requests": "running"}


async def _counts(request: web.Request) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The requests waiting and running by priority class, and those in flight per worker (every process's of
    `serve --workers N`; this process's own else: the second is then empty, each worker's own count stands)."""
    if PROCESS_GROUP not in request.app:
        own = request.app[METRICS].classes.items()
        return [{"name": p.value, "waiting": c.waiting, "running": c.running} for p, c in own], {}
    counts: dict[str, Counter[str]] = {"waiting": Counter(), "running": Counter()}
    in_flight: Counter[str] = Counter()
    for families in (await every_process_families(request.app)).values():
        for family in families:
            column = _CLASS_FAMILIES.get(family.name)
            if column is not None:
                counts[column].update({s.labels.get("priority", ""): int(s.value) for s in family.samples})
            elif family.name == "turnout_worker_in_flight":
                in_flight.update({s.labels.get("worker", ""): int(s.value) for s in family.samples})
    classes = [
        {"name": p.value, "waiting": counts["waiting"][p.value], "running": counts["running"][p.value]} for p in CLASSES
    ]
    return classes, dict(in_flight)


def _shared_state(request: web.Request) -> dict[str, Any] | None:
    """With ``storage.redis_url``: whether the replicas' shared routing state answers, and how many replicas share
    it (None without Redis: nothing is shared)."""
    occupancy = request.app[DISPATCHER].occupancy
    if not isinstance(occupancy, RedisOccupancy):
        return None
    return {"up": occupancy.up, "replicas": occupancy.replicas}


@page
async def overview(request: web.Request) -> web.StreamResponse:
    return render(request, "overview.html", active="ui.overview", **await overview_state(request))


@page
async def overview_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_overview_body.html", **await overview_state(request))


def add_overview_routes(app: web.Application) -> None:
    app.router.add_get("/admin/overview", overview, name="ui.overview")
    app.router.add_get("/admin/overview/fragment", overview_fragment, name="ui.overview.fragment")
