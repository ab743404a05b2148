"""Admin JSON API for keys, usage and the audit log.

``POST /admin/api/keys`` returns the new key's plaintext once; every later read shows only its prefix.
Every change is written to the audit log with before/after. Bodies and queries are validated by the models
of :mod:`turnout.admin.inputs` before anything is written (a bad field is 422 naming it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
from aiohttp import web

from turnout.admin.concurrency import PreconditionFailed
from turnout.admin.inputs import AuditQuery, KeyCreate, KeyRotate, UsageQuery, parse_input
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError
from turnout.gateway.dialect import json_response
from turnout.gateway.keys import ACCOUNTANT, AUDIT, KEYS, SETTINGS, USAGE
from turnout.store.db import StoreError
from turnout.store.endpoints import EndpointExists
from turnout.store.keys import StaleRecord, parse_scopes

__all__ = [
    "AdminSignIns",
    "add_account_routes",
    "audit_change",
    "json_response",
    "read_object",
    "store_call",
]

ADMIN_ACTOR = "admin-api"


async def read_object(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def store_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a store call in a thread; unknown -> 404, a duplicate endpoint name -> 409, a row changed by
    another writer between check and write -> 412, any other store refusal -> 400."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except KeyError as exc:
        raise NotFound(str(exc.args[0]), code="unknown_key") from None
    except EndpointExists as exc:
        raise Conflict(str(exc), code="endpoint_exists") from None
    except StaleRecord as exc:
        raise PreconditionFailed(str(exc)) from None
    except StoreError as exc:
        raise BadRequest(str(exc)) from None


async def list_keys(request: web.Request) -> web.Response:
    records = await store_call(request.app[KEYS].all)
    return json_response({"keys": [r.to_json() for r in records]})


async def create_key(request: web.Request) -> web.Response:
    spec = parse_input(KeyCreate, await read_object(request))
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
    )
    await audit_change(request, "key.create", f"key:{record.prefix}", after=record.to_json())
    return json_response({"key": plaintext, "record": record.to_json(), "note": "the key is shown only once"}, 201)


async def revoke_key(request: web.Request) -> web.Response:
    before, after = await store_call(request.app[KEYS].revoke, request.match_info["ref"], now=time.time())
    request.app[ACCOUNTANT].forget()
    await audit_change(request, "key.revoke", f"key:{after.prefix}", before=before.to_json(), after=after.to_json())
    return json_response(after.to_json())


async def rotate_key(request: web.Request) -> web.Response:
    spec = parse_input(KeyRotate, await read_object(request))
    grace = request.app[SETTINGS].auth.rotate_grace_s if spec.grace_s is None else spec.grace_s
    old, new, plaintext = await store_call(
        request.app[KEYS].rotate, request.match_info["ref"], grace_s=grace, now=time.time()
    )
    request.app[ACCOUNTANT].forget()
    await audit_change(request, "key.rotate", f"key:{old.prefix}", before=old.to_json(), after=new.to_json())
    return json_response(
        {
            "key": plaintext,
            "record": new.to_json(),
            "old": old.to_json(),
            "note": "the key is shown only once; the old key works until old.expires_at",
        },
        201,
    )


async def usage(request: web.Request) -> web.Response:
    query = parse_input(UsageQuery, request.query)
    since = query.since_ts(time.time())
    key_id = None
    if query.key:
        key_id = (await store_call(request.app[KEYS].get, query.key)).id
    await request.app[ACCOUNTANT].usage.flush()
    rows = await store_call(request.app[USAGE].summary, since=since, key_id=key_id, bucket=query.bucket)
    return json_response({"since": since, "bucket": query.bucket, "rows": rows})


async def audit(request: web.Request) -> web.Response:
    query = parse_input(AuditQuery, request.query)
    entries = await store_call(
        request.app[AUDIT].entries, since=query.since_ts(time.time()), action=query.action, limit=query.limit
    )
    return json_response({"entries": [e.to_json() for e in entries]})


class AdminSignIns:
    """Audits admin access: the first success per client address, and failures at most once a minute per address."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._failed: dict[str, float] = {}

    async def note(self, request: web.Request, ok: bool) -> None:
        who = request.remote or "unknown"
        now = time.time()
        if ok:
            if who in self._seen:
                return
            self._seen.add(who)
            action = "admin.signin"
        else:
            if now - self._failed.get(who, 0.0) < 60:
                return
            self._failed[who] = now
            action = "admin.signin_failed"
        with contextlib.suppress(TurnoutError):
            await audit_change(request, action, f"admin:{who}")


async def audit_change(
    request: web.Request, action: str, target: str, *, before: Any = None, after: Any = None
) -> None:
    """Append one audit entry for an admin API change."""
    try:
        await asyncio.to_thread(
            request.app[AUDIT].record,
            actor=ADMIN_ACTOR,
            action=action,
            target=target,
            before=before,
            after=after,
            now=time.time(),
            detail=f"from {request.remote or 'unknown'}",
        )
    except StoreError as exc:
        raise TurnoutError(f"the change was made but could not be audited: {exc}") from None


def add_account_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/keys", list_keys)
    r.add_post("/admin/api/keys", create_key)
    r.add_post("/admin/api/keys/{ref}/revoke", revoke_key)
    r.add_post("/admin/api/keys/{ref}/rotate", rotate_key)
    r.add_get("/admin/api/usage", usage)
    r.add_get("/admin/api/audit", audit)
