"""Admin JSON API for keys, usage and the audit log.

``POST /admin/api/keys`` returns the new key's plaintext once; every later read shows only its prefix.
Every change is written to the audit log with before/after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from turnout.core.patterns import PatternError
from turnout.errors import BadRequest, NotFound, TurnoutError
from turnout.gateway.dialect import json_response
from turnout.gateway.keys import ACCOUNTANT, AUDIT, KEYS, SETTINGS, USAGE
from turnout.store.db import StoreError
from turnout.store.keys import parse_scopes

__all__ = [
    "AdminSignIns",
    "add_account_routes",
    "audit_change",
    "json_response",
    "parse_when",
    "read_object",
    "store_call",
]

ADMIN_ACTOR = "admin-api"


def parse_when(value: str | None, now: float, *, future: bool = False) -> float | None:
    """``2026-12-31``, an ISO timestamp, epoch seconds, or a duration (``24h``, ``7d``, ``30m``) back from now,
    or forward from now when ``future`` (expiry dates)."""
    if value is None or value == "":
        return None
    text = value.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        span = float(text[:-1]) * units[text[-1]]
        return now + span if future else now - span
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"cannot read time {value!r}: use 2026-12-31, an ISO timestamp, epoch seconds or 24h/7d"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _int_or_none(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{name} must be a positive integer")
    return value


async def read_object(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def store_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except KeyError as exc:
        raise NotFound(str(exc.args[0]), code="unknown_key") from None
    except StoreError as exc:
        raise BadRequest(str(exc)) from None


async def list_keys(request: web.Request) -> web.Response:
    records = await store_call(request.app[KEYS].all)
    return json_response({"keys": [r.to_json() for r in records]})


async def create_key(request: web.Request) -> web.Response:
    body = await read_object(request)
    unknown = set(body) - {"app", "tenant", "models", "rpm", "daily_tokens", "expires"}
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)}")
    app = body.get("app")
    if not isinstance(app, str) or not app:
        raise BadRequest('"app" is required: the application this key is for')
    tenant = body.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise BadRequest('"tenant" must be a string')
    models = body.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise BadRequest('"models" must be a list like ["model:qwen3:*"]')
    try:
        scopes = parse_scopes(models)
    except PatternError as exc:
        raise BadRequest(f"models: {exc}") from None
    now = time.time()
    expires = body.get("expires")
    expires_at = parse_when(str(expires), now, future=True) if expires is not None else None
    record, plaintext = await store_call(
        request.app[KEYS].create,
        app=app,
        tenant=tenant,
        scopes=scopes,
        rpm=_int_or_none(body, "rpm"),
        daily_tokens=_int_or_none(body, "daily_tokens"),
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
    body = await read_object(request)
    grace = body.get("grace_s", request.app[SETTINGS].auth.rotate_grace_s)
    if not isinstance(grace, int | float) or grace < 0:
        raise BadRequest("grace_s must be a number of seconds >= 0")
    old, new, plaintext = await store_call(
        request.app[KEYS].rotate, request.match_info["ref"], grace_s=float(grace), now=time.time()
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
    now = time.time()
    since = parse_when(request.query.get("since"), now) or now - 86_400
    bucket = request.query.get("bucket", "hour")
    if bucket not in ("hour", "day"):
        raise BadRequest("bucket must be hour or day")
    key_id = None
    if request.query.get("key"):
        key_id = (await store_call(request.app[KEYS].get, request.query["key"])).id
    await request.app[ACCOUNTANT].usage.flush()
    rows = await store_call(request.app[USAGE].summary, since=since, key_id=key_id, bucket=bucket)
    return json_response({"since": since, "bucket": bucket, "rows": rows})


async def audit(request: web.Request) -> web.Response:
    now = time.time()
    limit = request.query.get("limit", "100")
    if not limit.isdigit():
        raise BadRequest("limit must be a positive integer")
    entries = await store_call(
        request.app[AUDIT].entries,
        since=parse_when(request.query.get("since"), now),
        action=request.query.get("action") or None,
        limit=int(limit),
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
