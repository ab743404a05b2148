"""How an admin handler takes and keeps a change: the JSON object it sent, a store call off the event loop with the
store's refusals as API errors, and the audit entry naming who made it (:data:`AUDIT_ACTOR`).
:class:`AdminSignIns` audits admin access itself. Used by every admin API module and the UI's pages."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
from aiohttp import web

from turnout.admin.concurrency import PreconditionFailed
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError
from turnout.gateway.keys import AUDIT
from turnout.store.db import StoreError
from turnout.store.endpoints import EndpointExists
from turnout.store.keys import KeyRevoked, StaleRecord

__all__ = ["ADMIN_ACTOR", "AUDIT_ACTOR", "AdminSignIns", "audit_change", "read_object", "store_call"]

ADMIN_ACTOR = "admin-api"
# Who an admin request's audit entries name: "admin-api" (Bearer token) unless set, "admin-ui" for a browser session.
AUDIT_ACTOR: web.RequestKey[str] = web.RequestKey("audit_actor")


async def read_object(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def store_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a store call in a thread; unknown -> 404, a duplicate endpoint name or a change to a revoked key
    -> 409, a row changed by another writer between check and write -> 412, other store refusals -> 400."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except KeyError as exc:
        raise NotFound(str(exc.args[0]), code="unknown_key") from None
    except EndpointExists as exc:
        raise Conflict(str(exc), code="endpoint_exists") from None
    except KeyRevoked as exc:
        raise Conflict(str(exc), code="key_revoked") from None
    except StaleRecord as exc:
        raise PreconditionFailed(str(exc)) from None
    except StoreError as exc:
        raise BadRequest(str(exc)) from None


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
            actor=request.get(AUDIT_ACTOR, ADMIN_ACTOR),
            action=action,
            target=target,
            before=before,
            after=after,
            now=time.time(),
            detail=f"from {request.remote or 'unknown'}",
        )
    except StoreError as exc:
        raise TurnoutError(f"the change was made but could not be audited: {exc}") from None
