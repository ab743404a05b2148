"""One call through the normal path, after its key is known and its body read: scopes, a stored Responses
conversation, limits, the proxy (placement, routing, the dispatcher's queue at the call's priority), usage.

The client routes (:mod:`turnout.gateway.routes`) serve every proxied request through :func:`answer`, and the Batch
API's runner (:mod:`turnout.gateway.batch_runner`) each line of a batch, at priority ``batch`` and with the batch's
id in its usage row: one path, so a line is checked, limited, routed and accounted as the same request sent by its
key would be (only its limits differ: :func:`turnout.core.batches.line_limits`).
"""

from __future__ import annotations

import time

from aiohttp import web

from turnout.core.admission import Priority
from turnout.dialects.base import Call, Endpoint
from turnout.errors import TurnoutError
from turnout.gateway.access import USAGE_ROW
from turnout.gateway.accounting import Outcome, Ticket
from turnout.gateway.keys import ACCOUNTANT, PROXY, STORED
from turnout.gateway.preemption import STOPPABLE
from turnout.store.keys import KeyRecord

__all__ = ["answer"]


async def answer(
    request: web.Request,
    key: KeyRecord | None,
    call: Call,
    *,
    priority: Priority = Priority.STANDARD,
    batch_id: str | None = None,
) -> web.StreamResponse:
    """The answer to ``call`` asked by ``key`` (``request[USAGE_ROW]`` set when it is accounted). ``priority``: the
    dispatcher's class for it; ``batch_id``: the Batch API batch whose line it is (its limits, its usage row)."""
    app = request.app
    accountant = app[ACCOUNTANT]
    endpoint = call.endpoint
    if endpoint is Endpoint.SHOW:
        accountant.check_scope(key, call.model, call.alias)
        ticket = Ticket(key, 0, [], 0.0)
    else:
        asked = time.perf_counter()
        try:
            accountant.check_scope(key, call.model, call.alias)
            if endpoint is Endpoint.RESPONSES:  # its answer's id; a continuation's whole conversation
                call = await app[STORED].prepare(key, call)
            ticket = await accountant.admit(key, call, batch=batch_id is not None)
            # what the call is billed when its worker counts none, and what a translated answer then says
            call = call._replace(estimate=ticket.prompt_estimate)
        except TurnoutError as exc:  # 403 scope, 429 limit, 503 limits unavailable: an error of this key
            request[USAGE_ROW] = await accountant.finish(
                Ticket(key, 0, [], asked), call, Outcome(), exc.status, batch_id=batch_id
            )
            raise
    outcome = Outcome()
    if endpoint is Endpoint.RESPONSES:
        outcome.keep = app[STORED].keeper(key, call)
    status = 500
    stopped = False  # a batch request stopped for another (gateway.preemption): no usage row, it is sent again
    try:
        response = await app[PROXY].serve(request, call, outcome, "" if key is None else key.tenant, priority)
        status = response.status
        return response
    except TurnoutError as exc:
        status = exc.status
        raise
    except BaseException:  # client gone (cancelled) or a bug: refund the reservation
        outcome.failed = True
        stoppable = request.get(STOPPABLE)
        stopped = stoppable is not None and stoppable.stopped
        raise
    finally:
        if endpoint is not Endpoint.SHOW:
            request[USAGE_ROW] = await accountant.finish(
                ticket, call, outcome, status, batch_id=batch_id, record=not stopped
            )
