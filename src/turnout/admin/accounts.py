"""Admin JSON API for keys, tenants, apps, usage and the audit log.

``POST /admin/api/keys`` returns the new key's plaintext once; every later read shows only its prefix.
Every change is written to the audit log with before/after. Bodies and queries are validated by the models
of :mod:`turnout.admin.inputs` before anything is written (a bad field is 422 naming it).

Every key read carries its computed ``state`` (active, revoked, expired, in_grace with ``grace_until``),
``last_used`` (derived from the usage store: the request path never writes a key row) and its ``etag``;
``PATCH``, revoke and rotate take ``If-Match`` (412 when the key changed meanwhile, checked with the row
locked). Usage reads filter by key, endpoint, worker, model and route and answer JSON or CSV.

A team-admin (the admin gate lets them in kept to their tenants, :data:`turnout.admin.keys.TEAM_SCOPE`) sees
and manages only their tenants' keys, apps and usage: a key of another tenant is 403 ``forbidden_tenant``, and
a key they create or change must keep ``rpm``, ``daily_tokens`` and ``priority`` within the tenant's
``team_ceiling`` (``tenants.<name>.team_ceiling`` in config.json, set by an admin; a class above the tenant's
default class where it sets none).

Every key carries its ``priority`` (its own class, null: its tenant's) and ``effective_priority`` (the class its
requests are served at before a request header lowers it: :func:`turnout.core.priority.key_class`). A tenant's
default class is config.json's ``tenants.<t>.priority`` where it sets one, else the one set through
``PATCH /admin/api/tenants/{name}`` (an operator's change, audited as ``tenant.change``; refused with 409 where
config.json sets it, since that one would win).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from turnout.admin.changes import TEAM_SCOPE, audit_change, read_object, store_call
from turnout.admin.concurrency import check_if_match, etag_of
from turnout.admin.inputs import (
    AuditQuery,
    KeyChange,
    KeyCreate,
    KeyListQuery,
    KeyRotate,
    TenantChange,
    UsageQuery,
    parse_input,
)
from turnout.config import Settings
from turnout.core.admission import Priority
from turnout.core.priority import key_class, tenant_default
from turnout.core.roles import team_allows, within_ceiling
from turnout.errors import Conflict, Forbidden, Unprocessable
from turnout.gateway.keys import ACCOUNTANT, AUDIT, KEYS, SETTINGS, USAGE
from turnout.responses import json_response
from turnout.store.keys import KeyRecord, parse_scopes
from turnout.store.usage import BUCKETS, MAX_POINTS, SERIES_COLUMNS, SUMMARY_COLUMNS, UsageFilter, to_csv

__all__ = ["add_account_routes", "key_etag"]


def key_etag(record: KeyRecord) -> str:
    return etag_of(record.stored_json())


def key_view(record: KeyRecord, now: float, last_used: dict[int, float], settings: Settings) -> dict[str, Any]:
    return {
        **record.to_json(now),
        "effective_priority": record.priority_class(settings.tenant_class(record.tenant)).value,
        "last_used": last_used.get(record.id),
        "etag": key_etag(record),
    }


async def _last_used(request: web.Request) -> dict[int, float]:
    await request.app[ACCOUNTANT].usage.flush()
    used: dict[int, float] = await store_call(request.app[USAGE].last_used)
    return used


def _scope(request: web.Request) -> frozenset[str] | None:
    """The tenants a team-admin's request is kept to (None: every tenant)."""
    return request.get(TEAM_SCOPE)


def _own(request: web.Request, record: KeyRecord) -> None:
    scope = _scope(request)
    if not team_allows(scope, record.tenant):
        raise Forbidden(
            f"key {record.prefix} belongs to tenant {record.tenant!r}; as team-admin of "
            f"{', '.join(sorted(scope or ()))} you manage only that tenant's keys (operator or admin may)",
            code="forbidden_tenant",
        )


def _ceiling(
    request: web.Request,
    tenant: str,
    rpm: int | None,
    daily_tokens: int | None,
    priority: Priority | None = None,
    stored: Priority | None = None,
) -> None:
    """A team-admin's key must stay within the tenant's ceiling (``tenants.<t>.team_ceiling``); its class, at most
    the ceiling's, else the tenant's default class (``stored``: the store's default for the tenant)."""
    if _scope(request) is None:
        return
    configured = request.app[SETTINGS].tenants.get(tenant)
    if priority is not None:
        most = configured.team_ceiling.priority if configured is not None else None
        if most is None:
            most = key_class(None, tenant_default(None if configured is None else configured.priority, stored))
        if priority.rank < most.rank:
            raise Forbidden(
                f"priority must be at most {most.value} for a key of tenant {tenant!r} (its team ceiling: "
                f"tenants.{tenant}.team_ceiling.priority, set by an admin, else the tenant's default class); "
                f"{priority.value} is higher",
                code="over_ceiling",
            )
    if configured is None:
        return
    ceiling = configured.team_ceiling
    for field, value, most_n in (("rpm", rpm, ceiling.rpm), ("daily_tokens", daily_tokens, ceiling.daily_tokens)):
        if not within_ceiling(value, most_n):
            raise Forbidden(
                f"{field} must be at most {most_n} for a key of tenant {tenant!r} (its team ceiling, set by an admin "
                f"in tenants.{tenant}.team_ceiling); {'none (unlimited)' if value is None else value} is more",
                code="over_ceiling",
            )


def _key_check(request: web.Request, changes: dict[str, Any] | None = None) -> Any:
    """A check for the store to call with the key's row locked (If-Match; a team-admin's tenant and ceiling)."""
    headers = request.headers.copy()

    def check(record: KeyRecord) -> None:
        _own(request, record)
        if changes is not None:
            _ceiling(
                request,
                record.tenant,
                changes.get("rpm", record.rpm),
                changes.get("daily_tokens", record.daily_tokens),
                changes.get("priority", record.priority),
                record.tenant_priority,
            )
        check_if_match(headers, key_etag(record), f"key {record.prefix}")

    return check


def _with_etag(body: dict[str, Any], etag: str, status: int = 200) -> web.Response:
    response = json_response(body, status)
    response.headers["ETag"] = etag
    return response


async def list_keys(request: web.Request) -> web.Response:
    query = parse_input(KeyListQuery, request.query)
    records: list[KeyRecord] = await store_call(request.app[KEYS].all)
    now = time.time()
    scope = _scope(request)
    picked = [r for r in records if query.matches(r, now) and team_allows(scope, r.tenant)]
    used = await _last_used(request)
    settings = request.app[SETTINGS]
    return json_response({"keys": [key_view(r, now, used, settings) for r in picked]})


async def get_key(request: web.Request) -> web.Response:
    record = await store_call(request.app[KEYS].get, request.match_info["ref"])
    _own(request, record)
    view = key_view(record, time.time(), await _last_used(request), request.app[SETTINGS])
    return _with_etag(view, view["etag"])


async def change_key(request: web.Request) -> web.Response:
    now = time.time()
    spec = parse_input(KeyChange, await read_object(request))
    changes = spec.changes(now)
    before, after = await store_call(
        request.app[KEYS].update, request.match_info["ref"], now=now, check=_key_check(request, changes), **changes
    )
    request.app[ACCOUNTANT].forget()
    await audit_change(
        request, "key.change", f"key:{after.prefix}", before=before.to_json(now), after=after.to_json(now)
    )
    view = key_view(after, now, await _last_used(request), request.app[SETTINGS])
    return _with_etag(view, view["etag"])


async def create_key(request: web.Request) -> web.Response:
    spec = parse_input(KeyCreate, await read_object(request))
    scope = _scope(request)
    if scope is not None:
        if spec.tenant is None or spec.tenant not in scope:
            raise Forbidden(
                f"as team-admin you create keys for your tenant only: set tenant to {' or '.join(sorted(scope))}",
                code="forbidden_tenant",
            )
        stored = None
        if spec.priority is not None:
            stored = await store_call(request.app[KEYS].tenant_priority, spec.tenant)
        _ceiling(request, spec.tenant, spec.rpm, spec.daily_tokens, spec.priority_class(), stored)
    now = time.time()
    expires_at = spec.expires_at(now)
    record, plaintext = await store_call(
        request.app[KEYS].create,
        app=spec.app,
        tenant=spec.tenant,
        scopes=parse_scopes(spec.models),
        rpm=spec.rpm,
        daily_tokens=spec.daily_tokens,
        expires_at=expires_at,
        now=now,
        priority=spec.priority_class(),
    )
    await audit_change(request, "key.create", f"key:{record.prefix}", after=record.to_json(now))
    view = key_view(record, now, {}, request.app[SETTINGS])
    return _with_etag({"key": plaintext, "record": view, "note": "the key is shown only once"}, view["etag"], 201)


async def revoke_key(request: web.Request) -> web.Response:
    now = time.time()
    before, after = await store_call(
        request.app[KEYS].revoke, request.match_info["ref"], now=now, check=_key_check(request)
    )
    request.app[ACCOUNTANT].forget()
    await audit_change(
        request, "key.revoke", f"key:{after.prefix}", before=before.to_json(now), after=after.to_json(now)
    )
    view = key_view(after, now, await _last_used(request), request.app[SETTINGS])
    return _with_etag(view, view["etag"])


async def rotate_key(request: web.Request) -> web.Response:
    spec = parse_input(KeyRotate, await read_object(request))
    grace = request.app[SETTINGS].auth.rotate_grace_s if spec.grace_s is None else spec.grace_s
    now = time.time()
    old, new, plaintext = await store_call(
        request.app[KEYS].rotate, request.match_info["ref"], grace_s=grace, now=now, check=_key_check(request)
    )
    request.app[ACCOUNTANT].forget()
    await audit_change(request, "key.rotate", f"key:{old.prefix}", before=old.to_json(now), after=new.to_json(now))
    used = await _last_used(request)
    settings = request.app[SETTINGS]
    return json_response(
        {
            "key": plaintext,
            "record": key_view(new, now, used, settings),
            "old": key_view(old, now, used, settings),
            "note": "the key is shown only once; the old key works until old.expires_at",
        },
        201,
    )


async def list_tenants(request: web.Request) -> web.Response:
    scope = _scope(request)
    found = await store_call(request.app[KEYS].tenants)
    settings = request.app[SETTINGS]
    return json_response({"tenants": [_tenant_view(t, settings) for t in found if team_allows(scope, t["name"])]})


def _tenant_view(tenant: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """A tenant's row with its default class: ``priority`` as set through the API, ``config_priority`` as
    config.json sets it, ``default_priority`` the class its keys get when they set none."""
    configured = settings.tenant_class(tenant["name"])
    stored = None if tenant["priority"] is None else Priority(tenant["priority"])
    return {
        **tenant,
        "config_priority": None if configured is None else configured.value,
        "default_priority": key_class(None, tenant_default(configured, stored)).value,
    }


async def change_tenant(request: web.Request) -> web.Response:
    """``PATCH /admin/api/tenants/{name}`` ``{"priority": "batch" | null}``: the default class of the tenant's
    keys that set none. Refused (409) where config.json sets the tenant's class: that one applies."""
    name = request.match_info["name"]
    spec = parse_input(TenantChange, await read_object(request))
    configured = request.app[SETTINGS].tenant_class(name)
    if configured is not None:
        raise Conflict(
            f"tenant {name!r} has its class in config.json (tenants.{name}.priority: {configured.value}), which "
            "applies over one set here; change it there",
            code="set_in_config",
        )
    before, after = await store_call(request.app[KEYS].set_tenant_priority, name, spec.priority_class())
    request.app[ACCOUNTANT].forget()
    await audit_change(
        request,
        "tenant.change",
        f"tenant:{name}",
        before={"priority": None if before is None else before.value},
        after={"priority": None if after is None else after.value},
    )
    found = await store_call(request.app[KEYS].tenants)
    return json_response(next(_tenant_view(t, request.app[SETTINGS]) for t in found if t["name"] == name))


async def list_apps(request: web.Request) -> web.Response:
    scope = _scope(request)
    found = await store_call(request.app[KEYS].apps)
    return json_response({"apps": [a for a in found if team_allows(scope, a["tenant"])]})


async def _usage_filter(request: web.Request, query: UsageQuery) -> UsageFilter:
    key_id = None
    if query.key:
        record = await store_call(request.app[KEYS].get, query.key)
        _own(request, record)
        key_id = record.id
    scope = _scope(request)
    key_ids = None
    if scope is not None:  # a team-admin sees their tenants' keys' usage only
        records: list[KeyRecord] = await store_call(request.app[KEYS].all)
        key_ids = tuple(r.id for r in records if r.tenant in scope)
    return UsageFilter(
        key_id=key_id,
        endpoint=query.endpoint,
        worker=query.worker,
        model=query.model,
        route=query.route,
        key_ids=key_ids,
        batch=query.batch,
    )


def _filters(query: UsageQuery) -> dict[str, Any]:
    return {n: getattr(query, n) for n in ("key", "endpoint", "worker", "model", "route", "batch")}


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...], name: str) -> web.Response:
    return web.Response(
        body=to_csv(rows, columns).encode(),
        content_type="text/csv",
        charset="utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


async def usage(request: web.Request) -> web.Response:
    query = parse_input(UsageQuery, request.query)
    now = time.time()
    since, until = query.since_ts(now), (None if query.until is None else query.until_ts(now))
    where = await _usage_filter(request, query)
    await request.app[ACCOUNTANT].usage.flush()
    rows = await store_call(request.app[USAGE].summary, since=since, bucket=query.bucket, where=where, until=until)
    if query.format == "csv":
        return _csv(rows, SUMMARY_COLUMNS, f"turnout-usage-{int(since)}.csv")
    return json_response(
        {"since": since, "until": until, "bucket": query.bucket, "filters": _filters(query), "rows": rows}
    )


async def usage_series(request: web.Request) -> web.Response:
    """One point per bucket (requests, tokens, errors, latency percentiles) for charts; empty buckets are zeros."""
    query = parse_input(UsageQuery, request.query)
    now = time.time()
    since, until = query.since_ts(now), query.until_ts(now)
    if until < since:
        raise Unprocessable('"until" is before "since"', field="until")
    width = BUCKETS[query.bucket]
    if (int(until // width) - int(since // width)) + 1 > MAX_POINTS:
        raise Unprocessable(
            f'"bucket": {query.bucket} buckets from since to until are more than {MAX_POINTS} points; '
            "choose a wider bucket or a shorter range",
            field="bucket",
        )
    where = await _usage_filter(request, query)
    await request.app[ACCOUNTANT].usage.flush()
    points = await store_call(request.app[USAGE].series, since=since, until=until, bucket=query.bucket, where=where)
    if query.format == "csv":
        return _csv(points, SERIES_COLUMNS, f"turnout-usage-series-{int(since)}.csv")
    return json_response(
        {"since": since, "until": until, "bucket": query.bucket, "filters": _filters(query), "points": points}
    )


async def audit(request: web.Request) -> web.Response:
    query = parse_input(AuditQuery, request.query)
    now = time.time()
    entries = await store_call(
        request.app[AUDIT].entries,
        since=query.since_ts(now),
        until=query.until_ts(now),
        action=query.action,
        actor=query.actor,
        target=query.target,
        limit=query.limit,
    )
    return json_response({"entries": [e.to_json() for e in entries]})


async def audit_facets(request: web.Request) -> web.Response:
    """The actions and actors present in the log (for the audit page's filter menus)."""
    return json_response(await store_call(request.app[AUDIT].facets))


def add_account_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/keys", list_keys)
    r.add_post("/admin/api/keys", create_key)
    r.add_get("/admin/api/keys/{ref}", get_key)
    r.add_patch("/admin/api/keys/{ref}", change_key)
    r.add_get("/admin/api/tenants", list_tenants)
    r.add_patch("/admin/api/tenants/{name}", change_tenant)
    r.add_get("/admin/api/apps", list_apps)
    r.add_post("/admin/api/keys/{ref}/revoke", revoke_key)
    r.add_post("/admin/api/keys/{ref}/rotate", rotate_key)
    r.add_get("/admin/api/usage", usage)
    r.add_get("/admin/api/usage/series", usage_series)
    r.add_get("/admin/api/audit", audit)
    r.add_get("/admin/api/audit/facets", audit_facets)
