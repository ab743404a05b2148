"""Admin JSON API for the OpenAI Batch API's batches of every app: list them with their progress, read one, cancel one.

- ``GET /admin/api/batches?app=&status=&limit=``: the newest batches first (at most ``limit``, default 100), each
  OpenAI's batch object (:func:`turnout.gateway.batch_api.batch_object`) with the ``app`` and ``tenant`` it belongs
  to, ``done`` (lines answered) and ``progress`` (their share of the total, 0 to 1), and the ``runner`` holding it now
  (``host:pid:...``; None when none, or when Redis holds the leases).
- ``GET /admin/api/batches/{id}``: one.
- ``POST /admin/api/batches/{id}/cancel``: as the app's own ``POST /v1/batches/{id}/cancel`` (no new line starts;
  ``cancelling``, then ``cancelled``); 409 ``batch_not_cancellable`` when it is finalizing or has ended. Audited as
  ``batch.cancel``.

A team-admin sees and cancels only the batches of their tenants' apps (another's is 403 ``forbidden_tenant``).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from turnout.admin.changes import TEAM_SCOPE, audit_change, store_call
from turnout.admin.inputs import BatchListQuery, parse_input
from turnout.core.batches import can_cancel
from turnout.core.roles import team_allows
from turnout.errors import Conflict, Forbidden, NotFound
from turnout.gateway.batch_api import batch_object
from turnout.gateway.keys import BATCH_RUNNER, BATCH_STORE, KEYS
from turnout.responses import json_response
from turnout.store.batches import BatchRecord

__all__ = ["add_batch_routes", "batch_view", "list_batch_views"]


def batch_view(record: BatchRecord, tenants: dict[str, str]) -> dict[str, Any]:
    """A batch as the admin API, the UI and the CLI show it (``tenants``: app -> tenant): ``done``, its lines
    answered (in the output file, or in the error file with the answer they got); ``unanswered``, its lines that
    never got an answer (the batch cancelled, or its window over, first: in the error file with ``batch_cancelled``
    or ``batch_expired``, and in OpenAI's ``request_counts.failed``)."""
    done = record.completed + record.failed - record.unanswered
    return {
        **batch_object(record),
        "app": record.app,
        "tenant": tenants.get(record.app or ""),
        "done": done,
        "unanswered": record.unanswered,
        "progress": done / record.total if record.total else 0.0,
        "runner": record.runner,
    }


async def _tenants(request: web.Request) -> dict[str, str]:
    apps: list[dict[str, Any]] = await store_call(request.app[KEYS].apps)
    return {a["name"]: a["tenant"] for a in apps}


async def list_batch_views(request: web.Request, query: BatchListQuery) -> list[dict[str, Any]]:
    """The batches a request may see (a team-admin: their tenants' apps'), newest first."""
    tenants = await _tenants(request)
    scope = request.get(TEAM_SCOPE)
    apps = None if scope is None else [app for app, tenant in tenants.items() if tenant in scope]
    if query.app is not None:
        apps = [query.app] if apps is None or query.app in apps else []
    records: list[BatchRecord] = await store_call(
        request.app[BATCH_STORE].listing, apps=apps, status=query.status, limit=query.limit
    )
    return [batch_view(r, tenants) for r in records]


async def list_batches(request: web.Request) -> web.Response:
    query = parse_input(BatchListQuery, request.query)
    return json_response({"batches": await list_batch_views(request, query)})


async def _one(request: web.Request) -> tuple[BatchRecord, dict[str, str]]:
    batch_id = request.match_info["batch_id"]
    record: BatchRecord | None = await store_call(request.app[BATCH_STORE].batch, batch_id)
    if record is None:
        raise NotFound(f"no batch {batch_id} (turnout batch list shows them)", code="batch_not_found")
    tenants = await _tenants(request)
    tenant = tenants.get(record.app or "")
    scope = request.get(TEAM_SCOPE)
    if not team_allows(scope, tenant or ""):
        raise Forbidden(
            f"batch {batch_id} belongs to app {record.app!r} of tenant {tenant!r}; as team-admin of "
            f"{', '.join(sorted(scope or ()))} you see only that tenant's batches (operator or admin may)",
            code="forbidden_tenant",
        )
    return record, tenants


async def get_batch(request: web.Request) -> web.Response:
    record, tenants = await _one(request)
    return json_response(batch_view(record, tenants))


async def cancel_batch(request: web.Request) -> web.Response:
    record, tenants = await _one(request)
    if record.status not in ("cancelling", "cancelled"):
        if not can_cancel(record.status):
            raise Conflict(
                f"batch {record.id} is {record.status}: only a validating or in_progress batch can be cancelled",
                code="batch_not_cancellable",
            )
        after: BatchRecord | None = await store_call(request.app[BATCH_STORE].request_cancel, record.id, time.time())
        request.app[BATCH_RUNNER].cancelled(record.id)
        await audit_change(
            request,
            "batch.cancel",
            f"batch:{record.id}",
            before={"status": record.status},
            after={"status": "cancelling"},
        )
        record = after or record
    return json_response(batch_view(record, tenants))


def add_batch_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/batches", list_batches)
    r.add_get("/admin/api/batches/{batch_id}", get_batch)
    r.add_post("/admin/api/batches/{batch_id}/cancel", cancel_batch)
