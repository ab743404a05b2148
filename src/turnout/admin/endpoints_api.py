"""Admin JSON API for external endpoints: register, change, test, list, remove.

Registering prints (returns) a gateway key scoped to the endpoint's models once; removing the endpoint
revokes that key (and its rotations) unless ``?keep_keys=true``. A credential is accepted in the request
body, stored encrypted, and never returned: reads only say whether one is set. Bodies are validated by
:class:`~turnout.admin.inputs.EndpointCreate` / ``EndpointChange`` / ``EndpointTest`` before anything is
stored. Each endpoint has an ETag (of its stored record); ``PATCH`` and ``DELETE`` take ``If-Match``
(412 when it changed meanwhile), checked inside the store's transaction.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from sqlalchemy import Connection

from turnout.admin.changes import audit_change, read_object, store_call
from turnout.admin.concurrency import check_if_match, etag_of
from turnout.admin.inputs import EndpointChange, EndpointCreate, EndpointTest, parse_input
from turnout.core.endpoint_rules import name_clash, url_note
from turnout.core.endpoint_urls import base_urls
from turnout.errors import Conflict, NotFound, Unprocessable
from turnout.fleet.endpoints import EndpointManager, url_private
from turnout.gateway.keys import ACCOUNTANT, ENDPOINTS, KEYS, USAGE
from turnout.responses import json_response
from turnout.store.endpoints import EndpointRecord
from turnout.store.keys import KeyRecord, KeyStore

FALLBACK_WINDOW_S = 86_400  # fallbacks.since counts the last 24 hours

__all__ = ["add_endpoint_routes", "change_audit", "endpoint_etag", "endpoint_key"]


def endpoint_key(keys: KeyStore, name: str, now: float) -> tuple[KeyRecord, str]:
    """A key for app ``endpoint-<name>`` that reaches only this endpoint's models."""
    return keys.create(
        app=f"endpoint-{name}", tenant=None, scopes=[f"{name}/*"], rpm=None, daily_tokens=None, expires_at=None, now=now
    )


def change_audit(
    before: EndpointRecord, after: EndpointRecord, changes: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The before/after of an ``endpoint.change`` audit entry. A record only says whether a credential is
    set, so a new credential in place of an old one would look unchanged: it is recorded as ``"replaced"``
    (never the value)."""
    old, new = before.to_json(), after.to_json()
    if changes.get("credential") and before.credential is not None:
        new["credential"] = "replaced"
    return old, new


def endpoint_etag(record: EndpointRecord | dict[str, Any]) -> str:
    return etag_of(record.to_json() if isinstance(record, EndpointRecord) else _stored(record))


def _stored(view: dict[str, Any]) -> dict[str, Any]:
    """The stored part of a described endpoint (what its ETag covers)."""
    keys = (
        *("name", "url", "api", "credential", "fallback_model", "latency_budget_ms", "native_apis"),
        *("created_at", "updated_at"),
    )
    return {k: view[k] for k in keys}


def _precondition(request: web.Request, name: str) -> Any:
    """A check for the store to call with the current record inside its transaction (If-Match)."""
    headers = request.headers.copy()  # case-insensitive, safe to read from the store thread

    def check(record: EndpointRecord) -> None:
        check_if_match(headers, endpoint_etag(record), f'endpoint "{name}"')

    return check


async def _views(request: web.Request, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Described endpoints with their ETag and fallback counts (from the usage store, all replicas)."""
    await request.app[ACCOUNTANT].usage.flush()
    counts = await store_call(request.app[USAGE].fallback_counts, since=time.time() - FALLBACK_WINDOW_S)
    return [
        {**v, "etag": endpoint_etag(v), "fallbacks": counts.get(v["name"], {"total": 0, "since": 0})} for v in views
    ]


async def _view(request: web.Request, manager: EndpointManager, name: str) -> dict[str, Any]:
    view = manager.describe_one(name)
    if view is None:  # registered elsewhere (the CLI, another replica) and not synced yet, or unknown
        await store_call(manager.store.get, name)  # 404 when unknown
        await manager.sync()
        view = manager.describe_one(name)
        if view is None:
            raise NotFound(f'endpoint "{name}" is registered but cannot be used; see the gateway log')
    return (await _views(request, [view]))[0]


def _with_etag(body: dict[str, Any], etag: str, status: int = 200) -> web.Response:
    response = json_response(body, status)
    response.headers["ETag"] = etag
    return response


async def list_endpoints(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    return json_response(
        {
            "endpoints": await _views(request, manager.describe()),
            "private_networks_allowed": manager.private_networks_allowed,
        }
    )


def credential_value(manager: EndpointManager, credential: str | None, variable: str | None) -> str | None:
    """The credential given, or the value of ``variable`` in the gateway's own environment (so a form in a
    browser names a secret that lives only on the control plane). A variable that is unset is a 422."""
    if not variable:
        return credential
    value = manager.settings.endpoint_env.variables.get(variable, "")
    if not value:
        raise Unprocessable(
            f'"credential_env": {variable} is not set in the gateway\'s environment; set it where the gateway runs '
            "and restart it, or give the credential itself",
            field="credential_env",
        )
    return value


async def get_endpoint(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    view = await _view(request, manager, request.match_info["name"])
    return _with_etag({**view, "private_networks_allowed": manager.private_networks_allowed}, view["etag"])


async def add_endpoint(request: web.Request) -> web.Response:
    body = await read_object(request)
    spec = parse_input(EndpointCreate, body)
    body_url = body["url"]
    manager = request.app[ENDPOINTS]
    name = spec.name
    clash = name_clash(name, manager.configured_workers())
    if clash is not None:
        raise Unprocessable(clash, field="name")
    if await store_call(manager.store.exists, name):
        raise Conflict(
            f'an endpoint named "{name}" already exists; choose another name or change that one',
            code="endpoint_exists",
        )
    credential = credential_value(manager, spec.credential, spec.credential_env)
    now = time.time()
    record = await store_call(
        manager.store.add,
        name=name,
        url=spec.url,
        api=spec.api,
        credential=None if not credential else manager.secrets.encrypt(credential),
        fallback_model=spec.fallback_model or None,
        latency_budget_ms=spec.latency_budget_ms,
        native_apis=spec.native_apis,
        now=now,
    )
    key_record, key = await store_call(endpoint_key, request.app[KEYS], name, now)
    await manager.sync()
    probe = await manager.check(name)
    await audit_change(request, "endpoint.register", f"endpoint:{name}", after=record.to_json())
    await audit_change(request, "key.create", f"key:{key_record.prefix}", after=key_record.to_json(now))
    view = {**await _view(request, manager, name), "etag": endpoint_etag(record)}  # the tag of this write
    return _with_etag(
        {
            "endpoint": view,
            "test": None if probe is None else probe.to_json(),
            "urls": base_urls(str(request.url.origin()), name),  # where the key works (endpoints.md)
            "key": key,
            "key_prefix": key_record.prefix,
            "note": "the key is shown only once",
            "url_note": url_note(body_url),
        },
        view["etag"],
        201,
    )


async def test_unsaved(request: web.Request) -> web.Response:
    """Dry run: probe a URL / API type / credential that is not registered. Nothing is stored or audited."""
    body = await read_object(request)
    spec = parse_input(EndpointTest, body)
    manager = request.app[ENDPOINTS]
    name_taken = None
    if spec.name is not None:
        configured = name_clash(spec.name, manager.configured_workers()) is not None
        name_taken = configured or bool(await store_call(manager.store.exists, spec.name))
    credential = credential_value(manager, spec.credential, spec.credential_env)
    result = await manager.test_unsaved(spec.url, spec.api, credential or None)
    return json_response(
        {
            "test": result.to_json(),
            "url": spec.url,
            "url_note": url_note(body["url"]),
            "url_private": url_private(spec.url, manager.guard.nat64),
            "private_networks_allowed": manager.private_networks_allowed,
            "name_taken": name_taken,
        }
    )


async def change_endpoint(request: web.Request) -> web.Response:
    body = await read_object(request)
    if "name" in body:
        raise Unprocessable('"name": an endpoint cannot be renamed; remove it and register it again', field="name")
    spec = parse_input(EndpointChange, body)
    changes = spec.changes()
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    if spec.credential_env:
        changes["credential"] = credential_value(manager, None, spec.credential_env)
    if changes.get("credential"):
        changes["credential"] = manager.secrets.encrypt(changes["credential"])
    before, after = await store_call(
        manager.store.update, name, changes, now=time.time(), check=_precondition(request, name)
    )
    await manager.sync()
    old, new = change_audit(before, after, changes)
    await audit_change(request, "endpoint.change", f"endpoint:{name}", before=old, after=new)
    view = {**await _view(request, manager, name), "etag": endpoint_etag(after)}  # the tag of this write
    note = url_note(body["url"]) if isinstance(body.get("url"), str) else None
    return _with_etag({"endpoint": view, "url_note": note}, view["etag"])


async def remove_endpoint(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    keep = request.query.get("keep_keys", "false").strip().lower()
    if keep not in ("true", "false", "1", "0", "yes", "no"):
        raise Unprocessable('"keep_keys" must be true or false', field="keep_keys")
    keep_keys = keep in ("true", "1", "yes")
    now = time.time()
    keys = request.app[KEYS]

    def revoke(conn: Connection) -> list[tuple[KeyRecord, KeyRecord]]:
        return [] if keep_keys else keys.revoke_endpoint_keys(name, now=now, conn=conn)

    record, revoked = await store_call(manager.store.remove_and, name, check=_precondition(request, name), then=revoke)
    await manager.sync()
    request.app[ACCOUNTANT].forget()
    prefixes = [after.prefix for _, after in revoked]
    for before, after in revoked:
        await audit_change(request, "key.revoke", f"key:{after.prefix}", before=before.to_json(), after=after.to_json())
    await audit_change(
        request, "endpoint.remove", f"endpoint:{name}", before=record.to_json(), after={"revoked_keys": prefixes}
    )
    return json_response({"removed": name, "revoked_keys": prefixes, "kept_keys": keep_keys})


async def test_endpoint(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    await store_call(manager.store.get, name)  # 404 when unknown
    await manager.sync()
    probe = await manager.check(name)
    return json_response(
        {
            "endpoint": await _view(request, manager, name),
            "test": None if probe is None else probe.to_json(),
        }
    )


def add_endpoint_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/endpoints", list_endpoints)
    r.add_post("/admin/api/endpoints", add_endpoint)
    r.add_post("/admin/api/endpoints/test", test_unsaved)
    r.add_get("/admin/api/endpoints/{name}", get_endpoint)
    r.add_patch("/admin/api/endpoints/{name}", change_endpoint)
    r.add_delete("/admin/api/endpoints/{name}", remove_endpoint)
    r.add_post("/admin/api/endpoints/{name}/test", test_endpoint)
