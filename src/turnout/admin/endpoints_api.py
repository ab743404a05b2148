"""Admin JSON API for external endpoints: register, change, test, list, remove.

Registering prints (returns) a gateway key scoped to the endpoint's models once. A credential is accepted
in the request body, stored encrypted, and never returned: reads only say whether one is set. Bodies are
validated by :class:`~turnout.admin.inputs.EndpointCreate` / ``EndpointChange`` before anything is stored.
"""

from __future__ import annotations

import time

from aiohttp import web

from turnout.admin.accounts import audit_change, json_response, read_object, store_call
from turnout.admin.inputs import EndpointChange, EndpointCreate, parse_input
from turnout.errors import Unprocessable
from turnout.gateway.keys import ACCOUNTANT, ENDPOINTS, KEYS
from turnout.store.keys import KeyRecord, KeyStore

__all__ = ["add_endpoint_routes", "endpoint_key"]


def endpoint_key(keys: KeyStore, name: str, now: float) -> tuple[KeyRecord, str]:
    """A key for app ``endpoint-<name>`` that reaches only this endpoint's models."""
    return keys.create(
        app=f"endpoint-{name}", tenant=None, scopes=[f"{name}/*"], rpm=None, daily_tokens=None, expires_at=None, now=now
    )


async def list_endpoints(request: web.Request) -> web.Response:
    return json_response({"endpoints": request.app[ENDPOINTS].describe()})


async def add_endpoint(request: web.Request) -> web.Response:
    spec = parse_input(EndpointCreate, await read_object(request))
    manager = request.app[ENDPOINTS]
    name = spec.name
    if name in manager.fleet.workers and manager.fleet.workers[name].external is None:
        raise Unprocessable(
            f'"name": "{name}" is the name of a configured worker; choose another endpoint name', field="name"
        )
    now = time.time()
    record = await store_call(
        manager.store.add,
        name=name,
        url=spec.url,
        api=spec.api,
        credential=None if not spec.credential else manager.secrets.encrypt(spec.credential),
        fallback_model=spec.fallback_model or None,
        latency_budget_ms=spec.latency_budget_ms,
        now=now,
    )
    key_record, key = await store_call(endpoint_key, request.app[KEYS], name, now)
    await manager.sync()
    probe = await manager.check(name)
    await audit_change(request, "endpoint.register", f"endpoint:{name}", after=record.to_json())
    return json_response(
        {
            "endpoint": next(e for e in manager.describe() if e["name"] == name),
            "test": None if probe is None else probe.to_json(),
            "key": key,
            "key_prefix": key_record.prefix,
            "note": "the key is shown only once",
        },
        201,
    )


async def change_endpoint(request: web.Request) -> web.Response:
    body = await read_object(request)
    if "name" in body:
        raise Unprocessable('"name": an endpoint cannot be renamed; remove it and register it again', field="name")
    changes = parse_input(EndpointChange, body).changes()
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    if changes.get("credential"):
        changes["credential"] = manager.secrets.encrypt(changes["credential"])
    before, after = await store_call(manager.store.update, name, changes, now=time.time())
    await manager.sync()
    await audit_change(request, "endpoint.change", f"endpoint:{name}", before=before.to_json(), after=after.to_json())
    return json_response({"endpoint": next(e for e in manager.describe() if e["name"] == name)})


async def remove_endpoint(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    record = await store_call(manager.store.remove, name)
    await manager.sync()
    request.app[ACCOUNTANT].forget()
    await audit_change(request, "endpoint.remove", f"endpoint:{name}", before=record.to_json())
    return json_response({"removed": name})


async def test_endpoint(request: web.Request) -> web.Response:
    manager = request.app[ENDPOINTS]
    name = request.match_info["name"]
    await store_call(manager.store.get, name)  # 404 when unknown
    await manager.sync()
    probe = await manager.check(name)
    return json_response(
        {
            "endpoint": next(e for e in manager.describe() if e["name"] == name),
            "test": None if probe is None else probe.to_json(),
        }
    )


def add_endpoint_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/endpoints", list_endpoints)
    r.add_post("/admin/api/endpoints", add_endpoint)
    r.add_patch("/admin/api/endpoints/{name}", change_endpoint)
    r.add_delete("/admin/api/endpoints/{name}", remove_endpoint)
    r.add_post("/admin/api/endpoints/{name}/test", test_endpoint)
