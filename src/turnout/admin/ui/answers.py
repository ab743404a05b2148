"""What the admin JSON API answers, for the UI's pages: call the API's own handler with the page's request
and read its JSON body.

A page rendered this way shows exactly what ``/admin/api/...`` returns to a script (the same validation of
the query, the same computed fields such as a key's state or an endpoint's ETag), so no rule is decided
twice. The page's request has already passed its session check (``@page``); the API handlers do no
authentication of their own (the gateway's middleware does, before them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

__all__ = ["answer", "without_blanks"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def answer(handler: Handler, request: web.Request) -> Any:
    """The decoded JSON body of ``handler(request)`` (a :class:`TurnoutError` it raises propagates)."""
    response = await handler(request)
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        raise TypeError(f"{getattr(handler, '__name__', handler)} did not answer a JSON body")
    return orjson.loads(response.body)


def without_blanks(request: web.Request) -> web.Request:
    """The request with its empty query parameters left out: a filter form's "any" choice sends ``tenant=``,
    which means no filter, not an empty name."""
    kept = [(k, v) for k, v in request.query.items() if v.strip()]
    if len(kept) == len(request.query):
        return request
    return request.clone(rel_url=request.rel_url.with_query(kept))
