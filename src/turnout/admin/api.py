"""Admin JSON API: placement matrix and overrides, inventory, fleet status, ModelClaims.

All routes live under ``/admin/api`` and need the admin bearer token. Validation errors are 400/422,
an unknown worker is 404, and nothing is written when a request fails.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from aiohttp import web

from turnout.admin.accounts import audit_change
from turnout.admin.inputs import PlacementToggle, check_model_names, parse_input
from turnout.core.names import lookup
from turnout.core.placement import PlacementRules, resolve_placement, toggle_rule
from turnout.core.routing import installed_name
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError, Unprocessable
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.dialect import json_response
from turnout.gateway.keys import DISPATCHER, FLEET, PROXY
from turnout.state.placement_store import PlacementFileError, parse_rules_body

__all__ = ["MAX_RULES", "add_admin_routes"]

MAX_RULES = 1000  # patterns per list in one worker's placement override


def _worker(fleet: Fleet, request: web.Request) -> WorkerState:
    name = request.match_info["name"]
    state = fleet.workers.get(name)
    if state is None:
        known = ", ".join(fleet.workers) or "none configured"
        raise NotFound(f'unknown worker "{name}" (workers: {known})', code="unknown_worker")
    return state


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def placement_matrix(fleet: Fleet) -> dict[str, Any]:
    fleet.placement.refresh()
    models: set[str] = set()
    for state in fleet.workers.values():
        models |= state.inventory or set()
    for state in fleet.workers.values():  # a rule's model gets a row unless a row spells it another way
        models |= {n for n in fleet.rules(state.name)[0].exact_names() if lookup(n, models) is None}
    workers = []
    for state in fleet.workers.values():
        rules, source = fleet.rules(state.name)
        cells = {}
        for model in sorted(models):
            held = installed_name(model, state.inventory)
            verdict = resolve_placement(rules, model)
            cells[model] = {
                "installed": None if state.inventory is None else held is not None,
                "loaded": model in state.loaded,
                "allowed": verdict.allowed,
                "rule": verdict.rule,
                "source": source,
                "exact": verdict.exact,
            }
        workers.append(
            {
                "name": state.name,
                "healthy": state.healthy,
                "source": source,
                "rules": rules.to_json(),
                "cells": cells,
            }
        )
    return {
        "models": sorted(models),
        "workers": workers,
        "override_file": {"path": str(fleet.placement.path), "error": fleet.placement.error},
    }


async def get_placement(request: web.Request) -> web.Response:
    return json_response(placement_matrix(request.app[FLEET]))


async def put_placement(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    body = await _body(request)
    if isinstance(body, dict):
        for key in ("allowed_models", "denied_models"):
            check_model_names(body.get(key), key, limit=MAX_RULES)
    try:
        rules = parse_rules_body(body)
    except ValueError as exc:
        raise Unprocessable(f"invalid placement rules for {state.name}: {exc}", code="invalid_rules") from None
    before = fleet.rules(state.name)
    _store(fleet, lambda: fleet.placement.put(state.name, rules))
    request.app[DISPATCHER].wake_all()
    await _audit_rules(request, "placement.put", state.name, before)
    return json_response({"worker": state.name, "source": "override", "rules": rules.to_json()})


async def toggle_placement(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    body = await _body(request)
    if not isinstance(body, dict):
        raise BadRequest('body must be {"model": "<exact model name>"}')
    model = parse_input(PlacementToggle, body).model
    current, _ = fleet.rules(state.name)
    updated = toggle_rule(current, model)
    before = fleet.rules(state.name)
    _store(fleet, lambda: fleet.placement.put(state.name, updated))
    request.app[DISPATCHER].wake_all()
    await _audit_rules(request, "placement.toggle", state.name, before, detail=model)
    verdict = resolve_placement(updated, model)
    return json_response(
        {
            "worker": state.name,
            "model": model,
            "allowed": verdict.allowed,
            "rule": verdict.rule,
            "exact": verdict.exact,
            "rules": updated.to_json(),
        }
    )


async def delete_placement(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    before = fleet.rules(state.name)
    removed = _store(fleet, lambda: fleet.placement.delete(state.name))
    request.app[DISPATCHER].wake_all()
    if removed:
        await _audit_rules(request, "placement.delete", state.name, before)
    rules, source = fleet.rules(state.name)
    return json_response({"worker": state.name, "removed": bool(removed), "source": source, "rules": rules.to_json()})


async def _audit_rules(
    request: web.Request, action: str, worker: str, before: tuple[PlacementRules, str], detail: str | None = None
) -> None:
    rules, source = request.app[FLEET].rules(worker)
    await audit_change(
        request,
        action,
        f"worker:{worker}" + (f" model:{detail}" if detail else ""),
        before={"source": before[1], "rules": before[0].to_json()},
        after={"source": source, "rules": rules.to_json()},
    )


def _store(fleet: Fleet, action: Any) -> Any:
    try:
        return action()
    except PlacementFileError as exc:
        raise Conflict(str(exc), code="placement_file_broken") from None
    except OSError as exc:
        raise TurnoutError(f"cannot write {fleet.placement.path}: {exc.strerror}") from None


async def inventory(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    return json_response(
        {
            "workers": [
                {
                    "name": s.name,
                    "type": s.config.type.value,
                    "url": s.config.base_url,
                    "healthy": s.healthy,
                    "last_error": s.last_error,
                    "inventory_known": s.inventory is not None,
                    "installed": sorted(s.inventory) if s.inventory is not None else None,
                    "inventory_stale": s.inventory_stale,  # the last poll failed: "installed" is the one before
                    "inventory_error": s.inventory_error,
                    "inventory_age_s": None if s.inventory_at is None else round(time.monotonic() - s.inventory_at, 1),
                    "loaded": sorted(s.loaded),
                    "in_flight": s.in_flight,
                    "max_concurrent": s.config.max_concurrent,
                    "tokens_per_s": {m: round(v, 2) for m, v in s.speed.items()},
                    "gpu_util": s.gpu_util,
                    "vram_pressure": s.vram_pressure,
                }
                for s in fleet.workers.values()
            ]
        }
    )


async def claims(request: web.Request) -> web.Response:
    """ModelClaims as this gateway sees them: phase (after the route's own state), model, where it routes."""
    bindings = request.app[PROXY].claims
    if bindings is None:
        return json_response({"claims": [], "configured": False})
    out = []
    for view in bindings.source.views():
        bound = bindings.fleet.bindings.get(view.model)
        out.append(
            {
                "claim": view.key,
                "model": view.model,
                "phase": view.phase.value,
                "upstream": None if view.route is None else f"{view.route[0]}:{view.route[1]}",
                "serving": bound is not None and bound.claim == view.key,
                "in_flight": bound.in_flight if bound is not None else 0,
            }
        )
    return json_response({"claims": out, "configured": True, "wakes_sent": bindings.wakes_sent})


def add_admin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/placement", get_placement)
    r.add_put("/admin/api/placement/workers/{name}", put_placement)
    r.add_post("/admin/api/placement/workers/{name}/toggle", toggle_placement)
    r.add_delete("/admin/api/placement/workers/{name}", delete_placement)
    r.add_get("/admin/api/inventory", inventory)
    r.add_get("/admin/api/claims", claims)
