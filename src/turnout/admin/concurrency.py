"""Optimistic concurrency for the admin JSON API: ``ETag`` on what a client reads, ``If-Match`` on writes.

Used by the placement, endpoint and key routes. An ETag is a strong validator made from the JSON state
it describes (a SHA-256 prefix of its canonical bytes), so every replica computes the same tag for the same
state and nothing is stored. A write that carries ``If-Match`` is refused with **412 Precondition Failed**
(code ``stale_write``) when the tag no longer matches, and changes nothing; the 412 carries the current
``ETag`` so a client can reload. A write without ``If-Match`` is unconditional (scripts, the CLI).
``If-Match: *`` matches any current state. No aiohttp state is kept here; the handlers compare and write
without awaiting in between, so within one gateway a check and its write are atomic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from turnout.errors import PreconditionFailed

__all__ = ["PreconditionFailed", "check_if_match", "etag_of", "if_match"]


def etag_of(state: Any) -> str:
    """A quoted strong ETag for a JSON-serialisable state (keys sorted, so equal states get equal tags)."""
    digest = hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return f'"{digest[:20]}"'


def if_match(headers: Mapping[str, str]) -> list[str] | None:
    """The tags of an ``If-Match`` header (``W/`` stripped; weak tags compare by value), or None when absent."""
    raw = headers.get("If-Match")
    if raw is None or not raw.strip():
        return None
    tags = []
    for part in raw.split(","):
        tag = part.strip().removeprefix("W/")
        if tag and tag != "*" and not (tag.startswith('"') and tag.endswith('"') and len(tag) >= 2):
            tag = f'"{tag}"'  # be lenient with an unquoted tag (curl users)
        if tag:
            tags.append(tag)
    return tags


def check_if_match(headers: Mapping[str, str], current: str | None, what: str) -> None:
    """Raise :class:`PreconditionFailed` unless ``If-Match`` is absent or names ``current``.

    ``current`` None means the thing does not exist (then only an absent header passes). ``what`` names
    it in the message (``placement of worker "a"``)."""
    tags = if_match(headers)
    if tags is None:
        return
    if current is not None and ("*" in tags or current in tags):
        return
    shown = ", ".join(tags)[:200]
    if current is None:
        message = f"{what} does not exist any more (If-Match {shown}); reload it"
    else:
        message = (
            f"{what} has changed since you read it (If-Match {shown}, now {current}); "
            "nothing was changed: reload it and apply your change again"
        )
    err = PreconditionFailed(message)
    if current is not None:
        err.headers["ETag"] = current
    raise err
