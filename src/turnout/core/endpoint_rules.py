"""Rules for registering an external endpoint, decided here once for the admin API, the UI's form (a client
of that API), the CLI and the gateway's own sync from the store. ``turnout worker add`` uses :func:`base_url`
for a worker's URL too (workers get the same routes appended).

- :func:`base_url`: the URL a user pastes is often the one their server shows with its API suffix (LM Studio
  shows ``http://host:1234/v1``; Ollama users paste ``http://host:11434/api``). Turnout adds the routes
  (``/v1/models``, ``/api/tags``, ...) itself, so one trailing ``/v1`` or ``/api`` segment and trailing
  slashes are dropped. Only one segment goes: OpenRouter's ``https://openrouter.ai/api/v1`` becomes
  ``https://openrouter.ai/api``, whose ``/v1/models`` is the right route. :func:`url_note` words what was
  dropped, for the answer to say so.
- :func:`name_clash`: an endpoint may not take the name of a configured worker (both are routed by name).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["API_SUFFIXES", "BaseUrl", "base_url", "name_clash", "url_note"]

API_SUFFIXES = ("/v1", "/api")


@dataclass(frozen=True, slots=True)
class BaseUrl:
    url: str  # what Turnout stores and dials (routes are appended to it)
    dropped: str  # what was removed from the end of the given URL ("" when nothing)


def base_url(given: str) -> BaseUrl:
    """The base URL for ``given``: trailing slashes and one trailing API suffix (``/v1``, ``/api``) removed.
    A URL that is nothing but scheme and host is returned unchanged (but without trailing slashes)."""
    scheme, sep, rest = given.partition("://")
    if not sep:
        return BaseUrl(given, "")
    host, slash, path = rest.partition("/")
    if not slash or "?" in path or "#" in path:  # no path, or a query/fragment: leave it to the validator
        return BaseUrl(given, "")
    path = "/" + path
    trimmed = path.rstrip("/")
    for suffix in API_SUFFIXES:
        if trimmed.lower().endswith(suffix):
            trimmed = trimmed[: -len(suffix)].rstrip("/")
            break
    url = f"{scheme}://{host}{trimmed}"
    return BaseUrl(url, given[len(url) :])


def url_note(given: str) -> str | None:
    """What to tell the user when :func:`base_url` changed their URL (``using http://h:1234 (dropped /v1)``),
    or None when it is used as given."""
    found = base_url(given)
    if not found.dropped:
        return None
    return f"using {found.url} (dropped {found.dropped})"


def name_clash(name: str, configured_workers: Collection[str]) -> str | None:
    """Why ``name`` cannot be an endpoint's name (it is a configured worker's), or None."""
    if name in configured_workers:
        return (
            f'"name": "{name}" is the name of a configured worker; choose another endpoint name '
            "(or remove the worker from the config)"
        )
    return None
