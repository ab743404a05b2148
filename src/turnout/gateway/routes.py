"""Client-facing handlers: the OpenAI ``/v1`` and Ollama ``/api`` routes."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from turnout import __version__
from turnout.errors import Forbidden, NotFound, TurnoutError
from turnout.gateway.accounting import Outcome, Ticket
from turnout.gateway.calls import Endpoint, read_call
from turnout.gateway.catalog import ollama_ps, ollama_tags, openai_models
from turnout.gateway.dialect import Dialect, json_response
from turnout.gateway.keys import ACCOUNTANT, FLEET, PROXY, SETTINGS

__all__ = ["OLLAMA_COMPAT_VERSION", "add_client_routes"]

# Reported by /api/version: clients gate features on Ollama's version, not on Turnout's.
OLLAMA_COMPAT_VERSION = "0.12.0"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _proxied(dialect: Dialect, endpoint: Endpoint) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        app = request.app
        accountant = app[ACCOUNTANT]
        key = await accountant.authenticate(request)
        call = await read_call(request, dialect, endpoint, app[SETTINGS].limits.max_body_bytes)
        if endpoint is Endpoint.SHOW:
            accountant.check_scope(key, call.model)
            ticket = Ticket(key, 0, [], 0.0)
        else:
            asked = time.perf_counter()
            try:
                accountant.check_scope(key, call.model)
                ticket = await accountant.admit(key, call)
            except TurnoutError as exc:  # 403 scope, 429 limit, 503 limits unavailable: an error of this key
                await accountant.finish(Ticket(key, 0, [], asked), call, Outcome(), exc.status)
                raise
        outcome = Outcome()
        status = 500
        try:
            response = await app[PROXY].serve(request, call, outcome, "" if key is None else key.tenant)
            status = response.status
            return response
        except TurnoutError as exc:
            status = exc.status
            raise
        except BaseException:  # client gone (cancelled) or a bug: refund the reservation
            outcome.failed = True
            raise
        finally:
            if endpoint is not Endpoint.SHOW:
                await accountant.finish(ticket, call, outcome, status)

    return handler


async def _visible_to(request: web.Request) -> Callable[[str], bool]:
    """A filter of model names for the caller's key scopes (everything under open access)."""
    key = await request.app[ACCOUNTANT].authenticate(request)
    return (lambda _: True) if key is None else key.allows


async def list_models(request: web.Request) -> web.Response:
    return json_response(openai_models(request.app[FLEET], await _visible_to(request)))


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    for entry in openai_models(request.app[FLEET], await _visible_to(request))["data"]:
        if entry["id"] == model_id:
            return json_response(entry)
    raise NotFound(f'model "{model_id}" not found', code="model_not_found")


async def tags(request: web.Request) -> web.Response:
    return json_response(ollama_tags(request.app[FLEET], await _visible_to(request)))


async def ps(request: web.Request) -> web.Response:
    return json_response(ollama_ps(request.app[FLEET], await _visible_to(request)))


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_COMPAT_VERSION}, headers={"X-Turnout-Version": __version__})


async def root(request: web.Request) -> web.Response:
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


def add_client_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/chat/completions", _proxied(Dialect.OPENAI, Endpoint.CHAT))
    r.add_post("/v1/completions", _proxied(Dialect.OPENAI, Endpoint.COMPLETIONS))
    r.add_post("/v1/embeddings", _proxied(Dialect.OPENAI, Endpoint.EMBEDDINGS))
    r.add_get("/v1/models", list_models)
    r.add_get("/v1/models/{model_id:.+}", get_model)
    r.add_post("/api/chat", _proxied(Dialect.OLLAMA, Endpoint.CHAT))
    r.add_post("/api/generate", _proxied(Dialect.OLLAMA, Endpoint.GENERATE))
    r.add_post("/api/embed", _proxied(Dialect.OLLAMA, Endpoint.EMBED))
    r.add_post("/api/embeddings", _proxied(Dialect.OLLAMA, Endpoint.EMBED_LEGACY))
    r.add_post("/api/show", _proxied(Dialect.OLLAMA, Endpoint.SHOW))
    r.add_get("/api/tags", tags)
    r.add_get("/api/ps", ps)
    r.add_get("/api/version", version)
    r.add_get("/", root)
    for method, path in ENGINE_ADMIN_ROUTES:
        r.add_route(method, path, refused_engine_admin)
