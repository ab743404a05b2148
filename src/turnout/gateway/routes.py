"""Client-facing handlers: the OpenAI ``/v1`` (the Responses API's included) and Ollama ``/api`` routes.

Each route is served twice by the same handler: on the shared URL, and on each external endpoint's own URL
(``/endpoints/<name>/v1/...``, ``/endpoints/<name>/api/...``), where the endpoint's models go by their own
names (:mod:`turnout.core.endpoint_urls`; the model is mapped to its shared name in :func:`read_call`). A model
alias is resolved in :func:`read_call` too, before the scope check; listings show aliases beside models.

Every inference call is served at a priority class (:mod:`turnout.core.priority`): its key's, or a lower one its
``X-Turnout-Priority`` header asks for (a value that is not a class: 400 ``invalid_priority`` in the route's
dialect). A request that names one gets the class it was served at in the same header of its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from turnout import __version__
from turnout.core.admission import Priority
from turnout.core.endpoint_urls import ENDPOINT_ROUTE_PREFIX
from turnout.core.priority import HEADER, Chosen, InvalidPriority, request_class
from turnout.dialects import CLIENT_APIS
from turnout.dialects.base import Call, Dialect, Endpoint, Route
from turnout.errors import BadRequest, Forbidden, NotFound, TurnoutError
from turnout.gateway.access import CALLER, PRIORITY
from turnout.gateway.batch_api import BATCH_ROUTES
from turnout.gateway.calls import read_call
from turnout.gateway.catalog import anthropic_model, anthropic_models, ollama_ps, ollama_tags, openai_models
from turnout.gateway.keys import ACCOUNTANT, ALIASES, FLEET, SETTINGS, STORED
from turnout.gateway.serving import answer
from turnout.responses import json_response
from turnout.store.keys import KeyRecord

__all__ = ["OLLAMA_COMPAT_VERSION", "add_client_routes"]

# Reported by /api/version: clients gate features on Ollama's version, not on Turnout's.
OLLAMA_COMPAT_VERSION = "0.12.0"
ANTHROPIC_VERSION = "anthropic-version"  # the header every Anthropic SDK sends

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _proxied(dialect: Dialect, endpoint: Endpoint) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
        chosen = request[PRIORITY] = priority_of(request, key)
        try:
            call = await _read(request, dialect, endpoint)
            response = await answer(request, key, call, priority=chosen.priority)
        except TurnoutError as exc:
            if chosen.asked is not None:
                exc.headers[HEADER] = chosen.priority.value
            raise
        if chosen.asked is not None and not response.prepared:  # a stream has it already (the proxy's headers)
            response.headers[HEADER] = chosen.priority.value
        return response

    async def show(request: web.Request) -> web.StreamResponse:
        """A model's metadata: no worker's slot is asked for, so no class (the header is ignored)."""
        key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
        return await answer(request, key, await _read(request, dialect, endpoint))

    return show if endpoint is Endpoint.SHOW else handler


async def _read(request: web.Request, dialect: Dialect, endpoint: Endpoint) -> Call:
    app = request.app
    return await read_call(
        request,
        dialect,
        endpoint,
        app[SETTINGS].limits.max_body_bytes,
        namespace=endpoint_of(request),
        aliases=app[ALIASES].table,
    )


def priority_of(request: web.Request, key: KeyRecord | None) -> Chosen:
    """The class ``request`` is served at: its key's (open access without one: standard), or the lower one its
    header asks for; 400 ``invalid_priority`` for a value that is not a class."""
    settings = request.app[SETTINGS]
    ceiling = Priority.STANDARD if key is None else key.priority_class(settings.tenant_class(key.tenant))
    try:
        return request_class(ceiling, request.headers.getall(HEADER, ()))
    except InvalidPriority as exc:
        raise BadRequest(str(exc), code="invalid_priority") from None


def proxied_routes() -> list[tuple[Dialect, Route]]:
    """(dialect, route) for each route of each client API in the registry (:data:`turnout.dialects.CLIENT_APIS`)."""
    return [(dialect, route) for dialect, client in CLIENT_APIS.items() for route in client.routes]


def endpoint_of(request: web.Request) -> str | None:
    """The external endpoint whose own URL the request came to (None: the shared URL); 404 for a name that is
    not a registered endpoint."""
    name = request.match_info.get("endpoint")
    if name is None:
        return None
    state = request.app[FLEET].workers.get(name)
    if state is None or state.external is None:
        raise NotFound(
            f'no endpoint named "{name}": /endpoints/<name>/ serves the models of a registered endpoint '
            "(turnout endpoint list shows them)",
            code="endpoint_not_found",
        )
    return name


async def _visible_to(request: web.Request) -> Callable[[str], bool]:
    """A filter of model names for the caller's key scopes (everything under open access)."""
    key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
    return (lambda _: True) if key is None else key.allows


async def _listing(request: web.Request) -> dict[str, Any]:
    """The arguments of a catalog listing: the caller's scopes, the endpoint of an endpoint's own URL."""
    visible = await _visible_to(request)
    return {"fleet": request.app[FLEET], "allowed": visible, "endpoint": endpoint_of(request)}


async def list_models(request: web.Request) -> web.Response:
    listing = openai_models(**await _listing(request), aliases=request.app[ALIASES].table)
    if ANTHROPIC_VERSION in request.headers:  # an Anthropic SDK asks: its fields too
        listing = anthropic_models(listing)
    return json_response(listing)


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    for entry in openai_models(**await _listing(request), aliases=request.app[ALIASES].table)["data"]:
        if entry["id"] == model_id:
            return json_response(anthropic_model(entry) if ANTHROPIC_VERSION in request.headers else entry)
    raise NotFound(f'model "{model_id}" not found', code="model_not_found")


async def tags(request: web.Request) -> web.Response:
    return json_response(ollama_tags(**await _listing(request), aliases=request.app[ALIASES].table))


async def ps(request: web.Request) -> web.Response:
    return json_response(ollama_ps(**await _listing(request)))


async def stored_response(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}``: a stored response of the caller's app."""
    endpoint_of(request)
    key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
    return json_response(await request.app[STORED].response(key, request.match_info["response_id"]))


async def stored_input_items(request: web.Request) -> web.Response:
    """``GET /v1/responses/{id}/input_items``: the input items a stored response answered, a page at a time."""
    endpoint_of(request)
    key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
    items = await request.app[STORED].items(key, request.match_info["response_id"], dict(request.query))
    return json_response(items)


async def delete_stored_response(request: web.Request) -> web.Response:
    """``DELETE /v1/responses/{id}``: forget a stored response of the caller's app."""
    endpoint_of(request)
    key = request[CALLER] = await request.app[ACCOUNTANT].authenticate(request)
    return json_response(await request.app[STORED].delete(key, request.match_info["response_id"]))


async def version(request: web.Request) -> web.Response:
    endpoint_of(request)
    return web.json_response({"version": OLLAMA_COMPAT_VERSION}, headers={"X-Turnout-Version": __version__})


async def root(request: web.Request) -> web.Response:
    endpoint_of(request)
    return web.Response(text="Turnout is running")  # Ollama clients probe "/" for this


# Engine administration that Turnout never forwards: it routes inference, it does not manage engines.
ENGINE_ADMIN_ROUTES = (
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("POST", "/api/create"),
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
    ("*", "/api/blobs/{digest}"),
    ("*", "/api/v0/{tail:.*}"),
    ("*", "/slots"),
    ("*", "/slots/{tail:.*}"),
    ("*", "/sleep"),
    ("*", "/wake_up"),
    ("*", "/is_sleeping"),
    ("*", "/v1/models/load"),
    ("*", "/v1/models/unload"),
    ("*", "/v1/load_lora_adapter"),
    ("*", "/v1/unload_lora_adapter"),
)


async def refused_engine_admin(request: web.Request) -> web.StreamResponse:
    raise Forbidden(
        f"{request.method} {request.path} is an engine administration route; Turnout forwards only inference and "
        "listing routes and never pulls, deletes, loads or sleeps models on workers or endpoints. Do it on the "
        "machine itself.",
        code="route_not_forwarded",
    )


CLIENT_ROUTES: tuple[tuple[str, str, Handler], ...] = (
    # every route of every client API (its dialect module lists them), proxied the same way
    *((route.method, route.path, _proxied(dialect, route.endpoint)) for dialect, route in proxied_routes()),
    ("GET", "/v1/models", list_models),
    ("GET", "/v1/models/{model_id:.+}", get_model),
    ("GET", "/v1/responses/{response_id}", stored_response),
    ("GET", "/v1/responses/{response_id}/input_items", stored_input_items),
    ("DELETE", "/v1/responses/{response_id}", delete_stored_response),
    ("GET", "/api/tags", tags),
    ("GET", "/api/ps", ps),
    ("GET", "/api/version", version),
    *((method, path, refused_engine_admin) for method, path in ENGINE_ADMIN_ROUTES),
)


def add_client_routes(app: web.Application) -> None:
    """Every client route on the shared URL and, the same handler, on each endpoint's own URL."""
    r = app.router
    for prefix in ("", ENDPOINT_ROUTE_PREFIX):
        for method, path, handler in CLIENT_ROUTES:
            if method == "GET":
                r.add_get(prefix + path, handler)  # HEAD too
            else:
                r.add_route(method, prefix + path, handler)
    for method, path, handler in BATCH_ROUTES:  # the Batch API: on the shared URL only
        if method == "GET":
            r.add_get(path, handler)
        else:
            r.add_route(method, path, handler)
    r.add_get("/", root)
    r.add_get(ENDPOINT_ROUTE_PREFIX, root)
    r.add_get(ENDPOINT_ROUTE_PREFIX + "/", root)
