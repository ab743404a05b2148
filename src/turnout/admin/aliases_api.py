"""Admin JSON API for model aliases (docs/aliases.md): list, read, set, remove; and the models clients can ask for.

- ``GET /admin/api/aliases``: every alias in force (the config's and the runtime ones over them), each with its
  ``source``, the config alias a runtime one replaces (``config_model``), its ``ETag``, where its model is served
  now (``workers``, or the router's ``problem``) and the workers whose own model of that name it hides
  (``shadows``).
- ``GET /admin/api/aliases/{name}``: one, with its ``ETag`` header.
- ``PUT /admin/api/aliases/{name}`` ``{"model": "<model>"}``: set a runtime alias (201 when the name was no alias,
  else 200). ``If-Match`` (optional) names the alias as read: the runtime one, or the config one it would replace.
- ``DELETE /admin/api/aliases/{name}``: remove the runtime alias (a config alias of that name applies again); a
  config-only alias is a 409 (change config.json).
- ``GET /admin/api/models``: what ``/v1/models`` lists with no key (aliases included), each with the model it
  stands for and the workers the router would choose from now.

Input is checked by :class:`~turnout.admin.inputs.AliasSet`; chains, cycles and If-Match are decided inside the
store's transaction against what is stored then (:class:`~turnout.store.aliases.AliasStore`), so two replicas
cannot make a chain between them. Every write is audited (``alias.set``, ``alias.remove``) with the actor, and
announced to the other processes of the gateway (the request frame does that for every admin write).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from turnout.admin.changes import audit_change, read_object, store_call
from turnout.admin.concurrency import check_if_match, etag_of
from turnout.admin.inputs import AliasSet, parse_input
from turnout.core.aliases import Alias, AliasSource, AliasTable, alias_problem
from turnout.core.names import canonical, lookup
from turnout.core.routing import NoRoute
from turnout.errors import Conflict, NotFound, Unprocessable
from turnout.fleet.state import Fleet
from turnout.gateway.aliases import Aliases
from turnout.gateway.catalog import openai_models
from turnout.gateway.keys import ALIASES, DISPATCHER, FLEET, SETTINGS
from turnout.responses import json_response
from turnout.store.aliases import AliasRecord

__all__ = ["add_alias_routes", "alias_etag", "alias_views", "check_removal", "check_set"]


def alias_etag(alias: Alias, record: AliasRecord | None) -> str:
    """The ETag of an alias as it is in force: a runtime one by its stored row, a config one by its entry."""
    stamp = None if record is None else record.updated_at
    return etag_of({"name": alias.name, "model": alias.target, "source": alias.source.value, "updated_at": stamp})


def alias_views(config: Mapping[str, str], records: list[AliasRecord]) -> list[dict[str, Any]]:
    """Every alias in force, by name: name, model, source, the config alias a runtime one replaces, times, ETag
    (what the CLI shows without a gateway, and what the API adds the fleet's view to)."""
    table = AliasTable.merge(config, {r.name: r.model for r in records})
    stored = {canonical(r.name): r for r in records}
    configured = {canonical(n): t for n, t in config.items()}
    out = []
    for alias in table:
        record = stored.get(canonical(alias.name))
        out.append(
            {
                "name": alias.name,
                "model": alias.target,
                "source": alias.source.value,
                "config_model": configured.get(canonical(alias.name)) if record is not None else None,
                "created_at": None if record is None else record.created_at,
                "updated_at": None if record is None else record.updated_at,
                "etag": alias_etag(alias, record),
            }
        )
    return out


def _effective(config: Mapping[str, str], name: str, record: AliasRecord | None) -> Alias | None:
    """The alias called ``name`` in force: the runtime row, else the config's entry, else None."""
    if record is not None:
        return record.alias()
    for configured, target in config.items():
        if canonical(configured) == canonical(name):
            return Alias(configured, target, AliasSource.CONFIG)
    return None


def check_set(config: Mapping[str, str], spec: AliasSet, headers: Mapping[str, str] | None = None) -> Any:
    """The store's check for setting ``spec``: If-Match against the alias in force, then the one-step rule
    against every alias in force then (a 422 naming the field and what to change)."""

    def check(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
        current = _effective(config, spec.name, before)
        if headers is not None:
            check_if_match(headers, None if current is None else alias_etag(current, before), f'alias "{spec.name}"')
        table = AliasTable.merge(config, {r.name: r.model for r in stored})
        problem = alias_problem(spec.name, spec.model, table)
        if problem is not None:
            raise Unprocessable(problem.message, field=problem.field)

    return check


def check_removal(config: Mapping[str, str], name: str, where: str, headers: Mapping[str, str] | None = None) -> Any:
    """The store's check for removing the runtime alias ``name``: If-Match; a config-only alias is a 409 (``where``
    names the config file); a config alias that would chain once the runtime one is gone is a 409 too."""

    def check(before: AliasRecord | None, stored: list[AliasRecord]) -> None:
        current = _effective(config, name, before)
        if headers is not None:
            check_if_match(headers, None if current is None else alias_etag(current, before), f'alias "{name}"')
        if before is None and current is not None:
            raise Conflict(
                f'alias "{current.name}" is set in the config file ({where}): remove it there and restart the gateway '
                "(or set it here to replace it)",
                code="alias_in_config",
            )
        if before is None:
            return  # the store says 404
        rest = {r.name: r.model for r in stored if canonical(r.name) != canonical(name)}
        restored = _effective(config, name, None)
        if restored is not None:
            problem = alias_problem(restored.name, restored.target, AliasTable.merge(config, rest))
            if problem is not None:
                raise Conflict(
                    f'removing alias "{name}" would bring back the config file\'s "{restored.name}" -> '
                    f'"{restored.target}", and {problem.message}',
                    code="alias_chain",
                )

    return check


def _serving(request: web.Request, model: str) -> dict[str, Any]:
    """Where the router would send a request for ``model`` now: the candidate workers, or why none."""
    decision = request.app[DISPATCHER].locate(model)
    if isinstance(decision, NoRoute):
        return {"workers": [], "problem": {"code": decision.reason.value, "message": decision.message}}
    return {"workers": [c.worker for c in decision.candidates], "problem": None}


def _shadows(fleet: Fleet, name: str) -> list[str]:
    """Workers that list a model called ``name`` (which the alias hides from clients)."""
    return sorted(s.name for s in fleet.workers.values() if lookup(name, s.inventory) is not None)


def _full(request: web.Request, view: dict[str, Any]) -> dict[str, Any]:
    return {**view, **_serving(request, view["model"]), "shadows": _shadows(request.app[FLEET], view["name"])}


def _views(request: web.Request) -> list[dict[str, Any]]:
    aliases = request.app[ALIASES]
    return [_full(request, v) for v in alias_views(aliases.config, aliases.records)]


def _one(request: web.Request, name: str) -> dict[str, Any]:
    for view in _views(request):
        if canonical(view["name"]) == canonical(name):
            return view
    raise NotFound(f'no alias "{name}" (see: GET /admin/api/aliases)', code="unknown_alias")


def _with_etag(body: dict[str, Any], etag: str, status: int = 200) -> web.Response:
    response = json_response(body, status)
    response.headers["ETag"] = etag
    return response


async def list_aliases(request: web.Request) -> web.Response:
    aliases = request.app[ALIASES]
    await aliases.reload()  # what the store holds now, also what another replica just wrote
    return json_response({"aliases": _views(request), "problems": aliases.table.problems()})


async def get_alias(request: web.Request) -> web.Response:
    await request.app[ALIASES].reload()
    view = _one(request, request.match_info["name"])
    return _with_etag(view, view["etag"])


async def put_alias(request: web.Request) -> web.Response:
    body = await read_object(request)
    spec = parse_input(AliasSet, {**body, "name": request.match_info["name"]})
    aliases: Aliases = request.app[ALIASES]
    check = check_set(aliases.config, spec, request.headers.copy())
    before, _ = await store_call(aliases.store.put, spec.name, spec.model, now=time.time(), check=check)
    was = _effective(aliases.config, spec.name, before)
    await aliases.reload()
    view = _one(request, spec.name)
    await audit_change(
        request,
        "alias.set",
        f"alias:{spec.name}",
        before=None if was is None else {"model": was.target, "source": was.source.value},
        after={"model": view["model"], "source": view["source"]},
    )
    return _with_etag({"alias": view}, view["etag"], 200 if was is not None else 201)


async def delete_alias(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    aliases: Aliases = request.app[ALIASES]
    where = str(request.app[SETTINGS].config_path or "config.json")
    check = check_removal(aliases.config, name, where, request.headers.copy())
    removed = await store_call(aliases.store.remove, name, check=check)
    await aliases.reload()
    restored = aliases.table.get(name)
    await audit_change(
        request,
        "alias.remove",
        f"alias:{removed.name}",
        before={"model": removed.model, "source": AliasSource.RUNTIME.value},
        after=None if restored is None else {"model": restored.target, "source": restored.source.value},
    )
    return json_response({"removed": removed.name, "alias": None if restored is None else _one(request, name)})


async def list_models(request: web.Request) -> web.Response:
    """The models and aliases clients can ask for (as ``/v1/models`` lists them without a key)."""
    aliases = request.app[ALIASES]
    await aliases.reload()
    fleet = request.app[FLEET]
    out = []
    for entry in openai_models(fleet, aliases=aliases.table)["data"]:
        alias = aliases.table.get(entry["id"])
        model = entry["id"] if alias is None else alias.target
        alias_of = None if alias is None else alias.target
        out.append({"name": entry["id"], "alias_of": alias_of, **_serving(request, model)})
    return json_response({"models": out})


def add_alias_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/aliases", list_aliases)
    r.add_get("/admin/api/aliases/{name:.+}", get_alias)
    r.add_put("/admin/api/aliases/{name:.+}", put_alias)
    r.add_delete("/admin/api/aliases/{name:.+}", delete_alias)
    r.add_get("/admin/api/models", list_models)
