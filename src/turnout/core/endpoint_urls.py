"""Each external endpoint's own gateway URL, and the one mapping between its model names and the shared ones.

The shared URL calls an endpoint's models ``<endpoint>/<model>`` (``mac/qwen2.5:7b``), so they never collide
with the fleet's. Each endpoint also has its own base URL, ``/endpoints/<endpoint>/v1/...`` (OpenAI) and
``/endpoints/<endpoint>/api/...`` (Ollama), where its models go by their own names (``qwen2.5:7b``). The
gateway serves both with the same handlers: a request on an endpoint's URL has its model mapped to the shared
name at intake (:func:`shared_name`), and listings there map back (:func:`own_name`), so keys, scopes, limits,
usage, audit, fallback and errors work exactly as on the shared URL. Used by the gateway's client routes, the
endpoint manager (an endpoint's namespace) and the CLI and admin API (the URLs ``endpoint add`` prints).
"""

from __future__ import annotations

__all__ = ["ENDPOINT_ROUTE_PREFIX", "api_path", "base_urls", "own_name", "shared_name"]

# The route prefix of an endpoint's own URL (an aiohttp route with the variable ``endpoint``).
ENDPOINT_ROUTE_PREFIX = "/endpoints/{endpoint}"
_PATH_PREFIX = "/endpoints/"


def shared_name(endpoint: str | None, model: str) -> str:
    """The name a model has on the shared URL: ``<endpoint>/<model>`` for an endpoint's own URL, else as sent."""
    return model if endpoint is None else f"{endpoint}/{model}"


def own_name(endpoint: str, shared: str) -> str | None:
    """The name a shared model name has on ``endpoint``'s own URL; None when it is not that endpoint's model."""
    prefix = shared_name(endpoint, "")
    return shared[len(prefix) :] if shared.startswith(prefix) and len(shared) > len(prefix) else None


def api_path(path: str) -> str:
    """The client API path of a request path: ``/endpoints/mac/v1/models`` -> ``/v1/models``; others unchanged."""
    if not path.startswith(_PATH_PREFIX):
        return path
    _, slash, rest = path[len(_PATH_PREFIX) :].partition("/")
    return slash + rest if slash else "/"


def base_urls(origin: str, endpoint: str) -> dict[str, str]:
    """The base URLs clients use for ``endpoint``'s models, on its own URL and on the shared one.

    ``origin`` is the gateway's ``scheme://host:port``. OpenAI clients take a base URL ending in ``/v1``;
    Ollama clients take the URL that ``/api/...`` is appended to."""
    origin = origin.rstrip("/")
    own = f"{origin}{_PATH_PREFIX}{endpoint}"
    return {"openai": f"{own}/v1", "ollama": own, "shared_openai": f"{origin}/v1", "shared_ollama": origin}
