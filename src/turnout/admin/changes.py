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
from turnout.core.roles import Principal
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError
from turnout.gateway.keys import AUDIT
from turnout.store.db import StoreError
from turnout.store.endpoints import EndpointExists
from turnout.store.keys import KeyRevoked, StaleRecord, UnknownTenant

__all__ = [
    "ADMIN_ACTOR",
    "AUDIT_ACTOR",
    "PRINCIPAL",
    "TEAM_SCOPE",
    "AdminSignIns",
    "audit_change",
    "read_object",
    "store_call",
]

ADMIN_ACTOR = "token"  # the admin token's (break-glass) actor
# Who an admin request's audit entries name when set here (a sign-in that has no principal yet); else the
# request's principal (turnout.admin.keys.PRINCIPAL, set by the admin gate): "oidc:<sub>", "token", "cli:<user>".
AUDIT_ACTOR: web.RequestKey[str] = web.RequestKey("audit_actor")
# Who an admin request is from (set by the admin gate, turnout.admin.ui.gate), and, where only a team-admin role
# let it through, the tenants its handler must keep it to (None: every tenant).
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("turnout_principal")
TEAM_SCOPE: web.RequestKey[frozenset[str] | None] = web.RequestKey("turnout_team_scope")


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
    except UnknownTenant as exc:
        raise NotFound(str(exc.args[0]), code="tenant_not_found") from None
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
    """Audits admin access: the first success per client address and actor, and failures at most once a minute per
    address (a failure says only that it failed, never which part of what was sent was wrong)."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._failed: dict[str, float] = {}

    def may_note_failure(self, request: web.Request, now: float) -> bool:
        """True at most once a minute per client address (and then counts it)."""
        who = request.remote or "unknown"
        if now - self._failed.get(who, 0.0) < 60:
            return False
        self._failed[who] = now
        return True

    async def note(self, request: web.Request, ok: bool, actor: str | None = None) -> None:
        who = request.remote or "unknown"
        now = time.time()
        if ok:
            if (who, actor or "") in self._seen:
                return
            self._seen.add((who, actor or ""))
            action = "admin.signin"
        else:
            if not self.may_note_failure(request, now):
                return
            action = "admin.signin_failed"
        with contextlib.suppress(TurnoutError):
            await audit_change(request, action, f"admin:{who}")


async def audit_change(
    request: web.Request, action: str, target: str, *, before: Any = None, after: Any = None
) -> None:
    """Append one audit entry for an admin API change: the actor is the request's principal (a person's
    ``oidc:<sub>``, with their e-mail in the detail), ``token`` for the admin token."""
    principal = request.get(PRINCIPAL)
    actor = request.get(AUDIT_ACTOR) or (principal.actor if principal is not None else ADMIN_ACTOR)
    where = f"from {request.remote or 'unknown'}"
    if principal is not None and principal.person is not None:
        where = f"{principal.label} {where}"
    try:
        await asyncio.to_thread(
            request.app[AUDIT].record,
            actor=actor,
            action=action,
            target=target,
            before=before,
            after=after,
            now=time.time(),
            detail=where,
        )
    except StoreError as exc:
        raise TurnoutError(f"the change was made but could not be audited: {exc}") from None
