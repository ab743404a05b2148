"""API dialects: one module (or small folder) per API, client- or worker-facing.

Each owns its routes, its request rules, its error shape, its stream framing and its translation onto workers
that speak something else, behind the small interface of :mod:`.base`; the gateway knows dialects only through
it. Adding an API: a module implementing :class:`~turnout.dialects.base.ClientAPI`, its golden files under
``tests/dialects/golden``, and one line in :data:`CLIENT_APIS`.

Pure, like :mod:`turnout.core`: no I/O, no clock, no web framework (an import-linter contract keeps it so).
"""

from __future__ import annotations

from turnout.dialects import admin, anthropic, ollama, openai, responses
from turnout.dialects.base import ClientAPI, Dialect
from turnout.dialects.ollama.translate import ollama_error_from_openai

__all__ = ["CLIENT_APIS", "NATIVE_HEADERS", "api", "dialect_of", "worker_error_message"]

# Every client API the gateway serves, by dialect (the admin API's entry gives only its error shape).
CLIENT_APIS: dict[Dialect, ClientAPI] = {
    Dialect.OPENAI: openai.API,
    Dialect.OLLAMA: ollama.API,
    Dialect.RESPONSES: responses.API,
    Dialect.ANTHROPIC: anthropic.API,
    Dialect.ADMIN: admin.API,
}

# Client headers of an API's own that a worker serving that API natively is sent with the call (the gateway sends
# a worker no other client header: never the client's key).
NATIVE_HEADERS: dict[Dialect, tuple[str, ...]] = {Dialect.ANTHROPIC: ("anthropic-version", "anthropic-beta")}


def api(dialect: Dialect) -> ClientAPI:
    return CLIENT_APIS[dialect]


def dialect_of(path: str) -> Dialect:
    """Whose shape an answer on ``path`` (a shared-URL path, an endpoint's own prefix removed) takes."""
    if path.startswith("/admin/"):
        return Dialect.ADMIN
    if path.startswith("/api/"):
        return Dialect.OLLAMA
    if path.startswith("/v1/responses") and (len(path) == 13 or path[13] == "/"):
        return Dialect.RESPONSES
    if path.startswith("/v1/messages") and (len(path) == 12 or path[12] == "/"):
        return Dialect.ANTHROPIC
    return Dialect.OPENAI


def worker_error_message(body: bytes, status: int) -> str:
    """What a worker's error answer says, whichever dialect it is in (its message, or a short excerpt)."""
    message: str = ollama_error_from_openai(body, status)["error"]
    return message
