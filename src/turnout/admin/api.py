"""Admin JSON API: placement matrix and overrides, inventory, fleet status, ModelClaims.

All routes live under ``/admin/api`` and need the admin bearer token. Validation errors are 400/422,
an unknown worker is 404, and nothing is written when a request fails.

Placement state has one ETag per worker (:func:`placement_etag`: its override, or none, and its config
baseline); every placement write takes ``If-Match`` with that tag and is refused with 412 when another
client changed the worker in between (:mod:`turnout.admin.concurrency`). The matrix's own ``ETag`` header
validates the whole answer (``If-None-Match`` -> 304); writes compare against the worker's tag only, so two
tabs editing different workers never conflict.

Every placement write is decided and written inside one transaction of the overrides
(:meth:`~turnout.state.placement_shared.SharedPlacementStore.transaction`: the override file's lock and the shared
store's row held, the store's document re-read), so the ETag check and the change start from the last write of any
process or replica, and no write of another is lost. Each cell of the matrix is
:func:`turnout.core.placement.decide`: the router's ``resolve_placement`` and the origin of the deciding rule.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from aiohttp import web

from turnout.admin.changes import audit_change
from turnout.admin.concurrency import check_if_match, etag_of, if_match
from turnout.admin.inputs import OnlyInstalled, PlacementToggle, check_model_names, parse_input
from turnout.core.engines import FAMILIES
from turnout.core.names import lookup, model_name_problem
from turnout.core.placement import PlacementRules, decide, exact_rules, mode_origin, toggle_rule
from turnout.core.routing import installed_name
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError, Unprocessable
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.keys import DISPATCHER, FLEET, PROXY
from turnout.responses import json_response
from turnout.state.placement_store import PlacementFileError, parse_rules_body
from turnout.store.db import StoreError

__all__ = [
    "MAX_RULES",
    "add_admin_routes",
    "placement_cell",
    "placement_etag",
    "placement_matrix",
    "worker_placement",
]

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


def placement_etag(fleet: Fleet, name: str) -> str:
    """The ETag of one worker's placement state: its override (or none) and its config baseline."""
    override = fleet.placement.get(name)
    return etag_of(
        {
            "override": None if override is None else override.to_json(),
            "baseline": fleet.workers[name].baseline.to_json(),
        }
    )


def worker_placement(fleet: Fleet, state: WorkerState) -> dict[str, Any]:
    """One worker's placement: effective rules and their source, baseline, override, exact rules with
    their origin, inventory status and the ETag writes must match."""
    rules, source = fleet.rules(state.name)
    override = fleet.placement.get(state.name)
    baseline = state.baseline if override is not None else None
    return {
        "name": state.name,
        "healthy": state.healthy,
        "source": source,
        "rules": rules.to_json(),
        "baseline": state.baseline.to_json(),
        "override": None if override is None else override.to_json(),
        "mode_origin": mode_origin(rules, baseline).value,
        "exact_rules": exact_rules(rules, baseline),
        "inventory_known": state.inventory is not None,
        "inventory_stale": state.inventory_stale,
        "etag": placement_etag(fleet, state.name),
    }


def placement_cell(fleet: Fleet, state: WorkerState, model: str) -> dict[str, Any]:
    """One cell of the matrix: ``model`` on worker ``state``, decided by the router's rule (core ``decide``)."""
    rules, source = fleet.rules(state.name)
    return _cell(state, rules, source, model)


def _cell(state: WorkerState, rules: PlacementRules, source: str, model: str) -> dict[str, Any]:
    decision = decide(rules, model, state.baseline)
    inventory = state.inventory
    return {
        "installed": None if inventory is None else installed_name(model, inventory) is not None,
        "loaded": model in state.loaded,
        "allowed": decision.allowed,
        "rule": decision.rule,
        "source": source,
        "exact": decision.exact,
        "origin": decision.origin.value,
    }


def placement_matrix(fleet: Fleet) -> dict[str, Any]:
    fleet.placement.refresh()
    models: set[str] = set()
    for state in fleet.workers.values():
        models |= state.inventory or set()
    for state in fleet.workers.values():  # a rule's model gets a row unless a row spells it another way
        models |= {n for n in fleet.rules(state.name)[0].exact_names() if lookup(n, models) is None}
    workers = []
    ordered = sorted(models)
    for state in fleet.workers.values():
        row = worker_placement(fleet, state)
        rules, source = fleet.rules(state.name)
        row["cells"] = {model: _cell(state, rules, source, model) for model in ordered}
        workers.append(row)
    return {
        "models": ordered,
        "workers": workers,
        "override_file": {"path": str(fleet.placement.path), "error": fleet.placement.error},
    }


def _with_etag(body: dict[str, Any], etag: str, status: int = 200) -> web.Response:
    response = json_response(body, status)
    response.headers["ETag"] = etag
    return response


async def get_placement(request: web.Request) -> web.Response:
    """The matrix. Its ``ETag`` header validates the whole answer (cells included: inventory and residency
    change it too), so ``If-None-Match`` gets a 304 while nothing changed; writes use each worker's ``etag``."""
    body = orjson.dumps(placement_matrix(request.app[FLEET]))
    etag = etag_of(hashlib.sha256(body).hexdigest())
    if etag in (if_match({"If-Match": request.headers.get("If-None-Match", "")}) or []):
        return web.Response(status=304, headers={"ETag": etag})
    return web.Response(body=body, content_type="application/json", headers={"ETag": etag})


async def get_worker_placement(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    fleet.placement.refresh()
    state = _worker(fleet, request)
    row = worker_placement(fleet, state)
    row["installed"] = None if state.inventory is None else sorted(state.inventory)
    row["inventory_error"] = state.inventory_error
    return _with_etag(row, row["etag"])


@contextmanager
def _transaction(fleet: Fleet, request: web.Request, state: WorkerState) -> Iterator[None]:
    """The override file's transaction (lock held, file re-read) with the worker's If-Match checked in it:
    412 when another client changed the worker since the tag was read, 409 when the file is broken."""
    try:
        with fleet.placement.transaction():
            check_if_match(
                request.headers, placement_etag(fleet, state.name), f'the placement of worker "{state.name}"'
            )
            yield
    except PlacementFileError as exc:
        raise Conflict(str(exc), code="placement_file_broken") from None
    except StoreError as exc:
        raise TurnoutError(f"the placement overrides could not be stored, nothing was changed: {exc}") from None
    except OSError as exc:
        raise TurnoutError(f"cannot write {fleet.placement.path}: {exc.strerror}") from None


Change = Callable[[PlacementRules], PlacementRules]  # the worker's effective rules -> its new override


async def _write(
    request: web.Request, state: WorkerState, action: str, change: Change, detail: str | None = None
) -> tuple[PlacementRules, str]:
    """In one transaction: check If-Match, decide the new override from the current rules, store it; then wake
    waiting requests and audit. No await until the file is written."""
    fleet = request.app[FLEET]
    with _transaction(fleet, request, state):
        before = fleet.rules(state.name)
        rules = change(before[0])
        fleet.placement.put(state.name, rules)
        etag = placement_etag(fleet, state.name)  # the tag of this write, not of a later one
    request.app[DISPATCHER].wake_all()
    await _audit_rules(request, action, state.name, before, detail=detail, after=(rules, "override"))
    return rules, etag


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
    _, etag = await _write(request, state, "placement.put", lambda _: rules)
    return _with_etag({"worker": state.name, "source": "override", "rules": rules.to_json(), "etag": etag}, etag)


async def toggle_placement(request: web.Request) -> web.Response:
    """One click on a cell: the exact rule for the opposite verdict, or a UI exception removed (core
    ``toggle_rule``); decided from the rules as they are in the file now, inside the write's transaction."""
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    body = await _body(request)
    if not isinstance(body, dict):
        raise BadRequest('body must be {"model": "<exact model name>"}')
    model = parse_input(PlacementToggle, body).model
    updated, etag = await _write(
        request,
        state,
        "placement.toggle",
        lambda current: toggle_rule(current, model, baseline=state.baseline),
        detail=model,
    )
    decision = decide(updated, model, state.baseline)
    return _with_etag(
        {
            "worker": state.name,
            "model": model,
            "allowed": decision.allowed,
            "rule": decision.rule,
            "exact": decision.exact,
            "origin": decision.origin.value,
            "rules": updated.to_json(),
            "exact_rules": exact_rules(updated, state.baseline),
            "etag": etag,
        },
        etag,
    )


async def only_installed(request: web.Request) -> web.Response:
    """ "Only installed": the worker's override becomes a whitelist of exactly its current inventory."""
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    raw = await request.read()
    body = await _body(request) if raw.strip() else {}
    if not isinstance(body, dict):
        raise BadRequest('body must be a JSON object (or empty), e.g. {"accept_stale": true}')
    spec = parse_input(OnlyInstalled, body)
    if state.inventory is None:
        why = f" (last error: {state.inventory_error})" if state.inventory_error else ""
        raise Conflict(
            f'the inventory of worker "{state.name}" is not known yet{why}: "only installed" needs its /api/tags; '
            "wait for the next successful poll (GET /admin/api/inventory) or write a whitelist with PUT",
            code="inventory_unknown",
        )
    if state.inventory_stale and not spec.accept_stale:
        raise Conflict(
            f'the inventory of worker "{state.name}" is stale: its last listing failed ({state.inventory_error}); '
            'send {"accept_stale": true} to whitelist the models it listed before, or wait for the next poll',
            code="inventory_stale",
        )
    names = sorted(n for n in state.inventory if "*" not in n and model_name_problem(n, "model") is None)
    skipped = sorted(set(state.inventory) - set(names))
    if len(names) > MAX_RULES:
        raise Conflict(f'worker "{state.name}" lists {len(names)} models, more than {MAX_RULES} rules', code="too_many")
    rules = PlacementRules.parse("whitelist", names, [])
    _, etag = await _write(request, state, "placement.only_installed", lambda _: rules)
    return _with_etag(
        {
            "worker": state.name,
            "source": "override",
            "rules": rules.to_json(),
            "inventory_stale": state.inventory_stale,
            "skipped": skipped,
            "etag": etag,
        },
        etag,
    )


async def delete_placement(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    state = _worker(fleet, request)
    with _transaction(fleet, request, state):
        before = fleet.rules(state.name)
        removed = fleet.placement.delete(state.name)
        rules, source = fleet.rules(state.name)
        etag = placement_etag(fleet, state.name)  # before any await: the tag of this write
    request.app[DISPATCHER].wake_all()
    if removed:
        await _audit_rules(request, "placement.delete", state.name, before, after=(rules, source))
    return _with_etag(
        {"worker": state.name, "removed": bool(removed), "source": source, "rules": rules.to_json(), "etag": etag},
        etag,
    )


async def _audit_rules(
    request: web.Request,
    action: str,
    worker: str,
    before: tuple[PlacementRules, str],
    detail: str | None = None,
    *,
    after: tuple[PlacementRules, str],
) -> None:
    await audit_change(
        request,
        action,
        f"worker:{worker}" + (f" model:{detail}" if detail else ""),
        before={"source": before[1], "rules": before[0].to_json()},
        after={"source": after[1], "rules": after[0].to_json()},
    )


async def inventory(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    now, ttl_s = time.monotonic(), fleet.settings.routing.speed_ttl_s
    return json_response(
        {
            "workers": [
                {
                    "name": s.name,
                    "type": s.config.type.value,
                    "native_apis": sorted(s.native_apis),
                    "url": s.config.base_url,
                    "healthy": s.healthy,
                    "last_error": s.last_error,
                    # models taken out here after their requests failed (the worker serves its others)
                    "models_out": s.models_out(time.monotonic()),
                    "inventory_known": s.inventory is not None,
                    "installed": sorted(s.inventory) if s.inventory is not None else None,
                    "inventory_stale": s.inventory_stale,  # the last poll failed: "installed" is the one before
                    "inventory_error": s.inventory_error,
                    "inventory_age_s": None if s.inventory_at is None else round(time.monotonic() - s.inventory_at, 1),
                    "loaded": sorted(s.loaded),
                    "in_flight": s.in_flight,
                    "max_concurrent": s.config.max_concurrent,
                    # learned per model, fresh ones only: decode (completion tokens/s after the first) and prefill
                    # (uncached prompt tokens/s); and the share of prompt tokens served from the engine's cache
                    "tokens_per_s": {m: round(v, 2) for m, v in s.decode_rates(now, ttl_s).items()},
                    "prefill_tokens_per_s": {m: round(v, 2) for m, v in s.prefill_rates(now, ttl_s).items()},
                    # how much what its engine runs at once slows each (turnout.core.sharing), learned ones only
                    "sharing": {m: round(v, 3) for m, v in s.sharings(now, ttl_s).items()},
                    "prefix_hit_rate": None if s.hit_rate is None else round(s.hit_rate, 3),
                    # the engine as it names itself (llama.cpp, vLLM, SGLang; None: not named), and what it runs
                    # at once per model (a model not answered yet: "*"), with how that was found
                    "engine": None if s.engine_family is None else FAMILIES[s.engine_family],
                    "parallelism": {m: p.to_json() for m, p in s.parallelisms(now).items()},
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
    r.add_get("/admin/api/placement/workers/{name}", get_worker_placement)
    r.add_post("/admin/api/placement/workers/{name}/only-installed", only_installed)
    r.add_put("/admin/api/placement/workers/{name}", put_placement)
    r.add_post("/admin/api/placement/workers/{name}/toggle", toggle_placement)
    r.add_delete("/admin/api/placement/workers/{name}", delete_placement)
    r.add_get("/admin/api/inventory", inventory)
    r.add_get("/admin/api/claims", claims)
