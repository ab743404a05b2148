"""Reading a client request into a :class:`~turnout.dialects.base.Call`: dialect, endpoint, model, stream flag,
body (the dialect's own rules, where the model is named and whether it streams by default, are its module's).

Every malformed input becomes a 400/413 :class:`TurnoutError` here, before any routing happens: bodies
that are not a JSON object, JSON nested deeper than :data:`MAX_JSON_DEPTH`, and model names that
:func:`turnout.core.names.model_name_problem` refuses (control characters, longer than 256 characters).

A model alias is resolved here too (:meth:`turnout.core.aliases.AliasTable.resolve`), before scopes, limits,
placement and routing: the call carries the model the alias stands for, in ``model`` and in its body, and the
alias in ``alias``, so every later step treats it as a request for that model.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from turnout.core.aliases import AliasTable
from turnout.core.endpoint_urls import api_path, own_name, shared_name
from turnout.core.names import model_name_problem
from turnout.dialects import api
from turnout.dialects.base import Call, Dialect, Endpoint
from turnout.errors import BadRequest, PayloadTooLarge

__all__ = ["MAX_JSON_DEPTH", "Call", "Endpoint", "call_of", "json_depth_exceeds", "read_call"]

MAX_JSON_DEPTH = 64  # objects/arrays nested deeper than this are refused (no client needs more)
MAX_TOKENS_FIELD = 2**31 - 1  # the largest token count a client may ask for (reservations must stay finite)


async def read_call(
    request: web.Request,
    dialect: Dialect,
    endpoint: Endpoint,
    max_body: int,
    *,
    namespace: str | None = None,
    aliases: AliasTable | None = None,
) -> Call:
    """The call a request makes. ``namespace``: the external endpoint whose own URL it came to; its model is
    then that endpoint's own name, and the call carries the shared name (``<endpoint>/<model>``) from here on,
    so every later rule (scopes, limits, routing, usage, fallback) is the shared URL's. ``aliases``: the model
    aliases in force; a call naming one carries the model it stands for (see the module's docstring)."""
    if request.content_length is not None and request.content_length > max_body:
        raise _too_large(max_body)
    content = request.content
    if content.is_eof():  # the whole body has arrived (a usual request): taken as it is, without an await
        body = content.read_nowait()
        if len(body) > max_body:  # decoded (Content-Encoding) larger than its Content-Length said
            raise _too_large(max_body)
    else:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _too_large(max_body) from None
    return call_of(body, dialect, endpoint, api_path(request.path), namespace=namespace, aliases=aliases)


def call_of(
    body: bytes,
    dialect: Dialect,
    endpoint: Endpoint,
    path: str,
    *,
    namespace: str | None = None,
    aliases: AliasTable | None = None,
) -> Call:
    """The call a request body makes on ``path`` (a shared-URL path): :func:`read_call`'s rules, for a body read
    already (a Batch API line's)."""
    if not body:
        raise BadRequest('request body is empty; send a JSON object with at least "model"')
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    if json_depth_exceeds(body, payload, MAX_JSON_DEPTH):
        raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep")
    rules = api(dialect)
    field, model = rules.model_field(endpoint, payload)
    if model is None or (isinstance(model, str) and not model.strip()):
        raise BadRequest('missing "model": name the model to use', code="missing_model")
    problem = model_name_problem(model, field)
    if problem is not None:
        raise BadRequest(problem, code="invalid_model")
    assert isinstance(model, str)
    _check_token_counts(payload)
    stream_default = rules.stream_default(endpoint)
    stream = payload.get("stream", stream_default)
    if stream is None:
        stream = stream_default
    if not isinstance(stream, bool):
        raise BadRequest('"stream" must be true or false')
    alias = None if not aliases else aliases.resolve(model, namespace)
    if alias is None:
        return Call(
            dialect,
            endpoint,
            path,
            body,
            payload,
            shared_name(namespace, model),
            stream and endpoint.streams,
        )
    # the body names the model as the client would have on this URL (the proxy maps it to the worker's name)
    sent = alias.target if namespace is None else (own_name(namespace, alias.target) or alias.target)
    payload = {**payload, field: sent}
    return Call(
        dialect,
        endpoint,
        path,
        orjson.dumps(payload),
        payload,
        alias.target,
        stream and endpoint.streams,
        alias=model,
    )


def _check_token_counts(payload: dict[str, Any]) -> None:
    """Token counts are reserved against limits before forwarding: they must be sane integers."""
    options = payload.get("options")
    fields = [(name, payload.get(name)) for name in ("max_tokens", "max_completion_tokens", "max_output_tokens")]
    if isinstance(options, dict):
        fields.append(("options.num_predict", options.get("num_predict")))
    for name, value in fields:
        if isinstance(value, int) and not isinstance(value, bool) and not -2 <= value <= MAX_TOKENS_FIELD:
            raise BadRequest(f'"{name}" must be between -2 and {MAX_TOKENS_FIELD}, got {value}', code="invalid_value")


def json_depth_exceeds(raw: bytes, value: object, limit: int) -> bool:
    """Whether ``value`` (decoded from ``raw``) nests objects/arrays deeper than ``limit``.

    Cheap for ordinary bodies: a body with at most ``limit`` brackets cannot be that deep (counting bytes
    is C speed and over-counts, since brackets inside strings count too). Only then is the value walked,
    iteratively, so a hostile body cannot exhaust the stack."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return False


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body is larger than the limit of {limit} bytes (limits.max_body_bytes)")
