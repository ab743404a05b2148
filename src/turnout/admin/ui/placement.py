"""The Model Placement page (matrix: one row per model, one column per worker) and the worker ruleset editor.

Both render from the admin API's own functions (:func:`turnout.admin.api.placement_matrix`,
:func:`~turnout.admin.api.placement_cell`, :func:`~turnout.admin.api.worker_placement`), which decide every
cell with :func:`turnout.core.placement.decide` (the router's ``resolve_placement`` and the deciding rule's
origin). Every change is a call to the JSON API from
``static/placement.js`` (toggle, PUT, only-installed, DELETE), with the worker's ETag in ``If-Match``, so a
tab that is out of date is told (412) instead of overwriting. After a toggle the script fetches the one
re-rendered cell from ``/admin/placement/cell`` (:func:`cell_state`, the matrix's cell for one model; a test
checks it equals the matrix's).

Cell marks (drawn as inline SVG symbols, ``templates/_marks.html``, each with its text for screen readers, so
they read the same without an emoji font): ``loaded`` (a filled dot), ``installed`` (a tick), ``allowed`` (a
ring: not installed), ``unknown`` (a question mark: the worker's inventory is unknown), ``blocked`` (a
no-entry sign); ``exact`` (a hooked arrow) in front when an exact rule decided; ``na`` (a small dot) where the
router never asks that column for that model (an external endpoint's or a claim's own models,
:func:`routed_to`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from turnout.admin.api import MAX_RULES, placement_cell, placement_matrix, worker_placement
from turnout.admin.inputs import check_model_names
from turnout.admin.ui.render import htmx, page, render, translator
from turnout.core.patterns import parse_pattern
from turnout.errors import NotFound, TurnoutError, Unprocessable
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.keys import FLEET
from turnout.responses import json_response

__all__ = ["add_placement_routes", "cell_state", "cell_view", "routed_to", "unrouted_view"]

Translate = Callable[..., str]


def cell_state(fleet: Fleet, state: WorkerState, model: str) -> dict[str, Any]:
    """One cell of :func:`placement_matrix` (the same function), without computing the rest."""
    return placement_cell(fleet, state, model)


def _explain(t: Translate, mode: str, cell: dict[str, Any], state: str) -> tuple[str, str]:
    """The rule part of a cell's explanation (shared by many cells: ``_matrix_view`` memoises it)."""
    origin = t(f"placement.origin.{cell['origin']}")
    if cell["rule"] == "mode":
        why = t("placement.why.mode", mode=t(f"placement.mode.{mode}"), origin=origin)
    elif cell["exact"]:
        why = t("placement.why.exact", rule=cell["rule"], origin=origin)
    else:
        why = t("placement.why.prefix", rule=cell["rule"], origin=origin)
    if cell["exact"] and cell["origin"] == "ui":
        action = t("placement.action.remove")
    elif cell["exact"]:  # a click writes the opposite exact rule into the override, which outranks the config
        action = t("placement.action.config_block" if cell["allowed"] else "placement.action.config_allow")
    else:
        action = t("placement.action.block" if cell["allowed"] else "placement.action.allow")
    held = ""
    if state == "blocked":
        installed = cell["installed"]
        held = " " + t("placement.held." + ("unknown" if installed is None else "yes" if installed else "no"))
    return t(f"placement.state.{state}") + held, f"{why}. {action}"


def cell_view(t: Translate, mode: str, cell: dict[str, Any], memo: dict[Any, Any] | None = None) -> dict[str, str]:
    """How a cell looks: its mark (symbol names for ``templates/_marks.html``), CSS classes, its text for screen
    readers (``label``: the state, and that an exact rule decided it where the ↳ mark says so), and its
    explanation (``state``: what the cell means, ``why``: the deciding rule, its origin and what a click does).
    The page script shows "<model> on <worker>: <state>. <why>" on hover and focus (``placement.cell``), so the
    explanation, shared by many cells, is sent once per page rather than once per cell."""
    installed = cell["installed"]
    if not cell["allowed"]:
        cls, state = "blk", "blocked"
    elif cell["loaded"]:
        cls, state = "ld", "loaded"
    elif installed is None:
        cls, state = "unk", "unknown"
    elif installed:
        cls, state = "ins", "installed"
    else:
        cls, state = "alw", "allowed"
    mark = state
    if cell["exact"]:
        mark = "exact " + mark
        cls += " ex"
    if installed and not cell["allowed"]:
        cls += " held"  # blocked, yet installed there: a small ✓ in the corner
    key = (mode, state, installed, cell["rule"], cell["exact"], cell["origin"], cell["allowed"])
    parts = memo.get(key) if memo is not None else None
    if parts is None:
        parts = _explain(t, mode, cell, state)
        if memo is not None:
            memo[key] = parts
    # what a screen reader says of the cell: its state and, as the ↳ mark shows, that an exact rule decided it
    label = t("placement.label.exact", state=parts[0]) if cell["exact"] else parts[0]
    return {"mark": mark, "cls": cls, "state": parts[0], "why": parts[1], "label": label}


def routed_to(fleet: Fleet, model: str) -> set[str] | None:
    """The columns the router considers for ``model`` (``Fleet.views``, its own candidate list), or None when
    that is every column (a fleet without external endpoints or claim bindings)."""
    if not fleet.endpoints and not fleet.bindings:
        return None
    return {view.name for view in fleet.views(model)}


def unrouted_view(t: Translate, fleet: Fleet, model: str, worker: str) -> dict[str, str]:
    """A cell the router never asks, whatever its rule: an endpoint's or a claim's model on another column,
    or a fleet model on an endpoint's or a claim's column. Not clickable."""
    target = fleet.endpoint_for(model) or fleet.bindings.get(model)
    if target is not None:
        why = t("placement.why.elsewhere", target=target.name)
    else:
        why = t("placement.why.own_models", worker=worker)
    state = t("placement.state.na")
    return {"mark": "na", "cls": "na", "state": state, "why": why, "label": state}


def _matrix_view(t: Translate, fleet: Fleet, matrix: dict[str, Any]) -> dict[str, Any]:
    """Rows of cells, each naming its explanation by index into ``explanations`` (one per distinct one)."""
    workers = matrix["workers"]
    memo: dict[Any, Any] = {}
    index: dict[tuple[str, str], int] = {}
    rows = []
    unrouted = False
    for model in matrix["models"]:
        routed = routed_to(fleet, model)
        cells = []
        for w in workers:
            if routed is not None and w["name"] not in routed:
                view = unrouted_view(t, fleet, model, w["name"])
                unrouted = True
            else:
                view = cell_view(t, w["rules"]["mode"], w["cells"][model], memo)
            view["e"] = str(index.setdefault((view["state"], view["why"]), len(index)))
            cells.append(view)
        rows.append({"model": model, "cells": cells})
    return {
        "workers": workers,
        "rows": rows,
        "explanations": list(index),
        "unrouted": unrouted,
        "override_file": matrix["override_file"],
    }


def _state(fleet: Fleet, name: str) -> WorkerState:
    state = fleet.workers.get(name)
    if state is None:
        raise NotFound(f'unknown worker "{name}"', code="unknown_worker")
    return state


@page
async def matrix_page(request: web.Request) -> web.StreamResponse:
    fleet = request.app[FLEET]
    view = _matrix_view(translator(request), fleet, placement_matrix(fleet))
    return render(request, "placement.html", active="ui.placement", **view)


@page
async def cell_fragment(request: web.Request) -> web.StreamResponse:
    """One re-rendered ``<td>`` (after a toggle): ``?worker=&model=``."""
    fleet = request.app[FLEET]
    fleet.placement.refresh()
    state = _state(fleet, request.query.get("worker", ""))
    model = request.query.get("model", "")
    if not model:
        raise Unprocessable("model is required", field="model")
    rules, _ = fleet.rules(state.name)
    t = translator(request)
    routed = routed_to(fleet, model)
    if routed is not None and state.name not in routed:
        return render(request, "_cell.html", c=unrouted_view(t, fleet, model, state.name))
    return render(request, "_cell.html", c=cell_view(t, rules.mode.value, cell_state(fleet, state, model)))


def _editor_context(fleet: Fleet, state: WorkerState) -> dict[str, Any]:
    fleet.placement.refresh()
    row = worker_placement(fleet, state)
    return {
        "w": row,
        "installed": None if state.inventory is None else sorted(state.inventory),
        "inventory_error": state.inventory_error,
    }


@page
async def editor_page(request: web.Request) -> web.StreamResponse:
    fleet = request.app[FLEET]
    state = _state(fleet, request.match_info["name"])
    context = _editor_context(fleet, state)
    if htmx(request) or request.query.get("fragment") == "1":
        return render(request, "_worker_rules.html", **context)
    return render(request, "worker_rules.html", active="ui.placement", **context)


@page
async def check_patterns(request: web.Request) -> web.StreamResponse:
    """Inline validation with the server's own rules (the PUT's checks): ``POST {"field", "patterns"}``.
    Answers ``{"ok": true}`` or ``{"ok": false, "field": "allowed_models[2]", "message": ...}`` (200 either
    way: a bad pattern is the answer here, not a failed request)."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("field") not in ("allowed_models", "denied_models"):
        raise Unprocessable('body must be {"field": "allowed_models"|"denied_models", "patterns": [...]}')
    field, patterns = str(body["field"]), body.get("patterns")
    try:
        check_model_names(patterns, field, limit=MAX_RULES)
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise Unprocessable(f"{field} must be a list of strings", field=field)
        for index, text in enumerate(patterns):
            try:
                parse_pattern(text)
            except ValueError as exc:
                raise Unprocessable(str(exc), field=f"{field}[{index}]") from None
    except Unprocessable as exc:
        return json_response({"ok": False, "field": exc.field or field, "message": exc.message})
    except TurnoutError as exc:
        return json_response({"ok": False, "field": field, "message": exc.message})
    return json_response({"ok": True})


def add_placement_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/placement", matrix_page, name="ui.placement")
    r.add_get("/admin/placement/cell", cell_fragment, name="ui.placement.cell")
    r.add_get("/admin/placement/workers/{name}", editor_page, name="ui.placement.worker")
    r.add_post("/admin/placement/check", check_patterns, name="ui.placement.check")
