"""Priority classes: which class a request is served at, decided once, here.

A request's class (:class:`~turnout.core.admission.Priority`: ``interactive`` before ``standard`` before
``batch``) starts from its key: the key's own class, else its tenant's default (``tenants.<t>.priority`` in
config.json, else the tenant's row in the store), else ``standard`` (:func:`key_class`). The request may lower it
with the header :data:`HEADER` (``X-Turnout-Priority: interactive|standard|batch``), never raise it: a class above
the key's is served at the key's class, and the answer says so in the same header (:func:`request_class`). A value
that is not a class (any case; surrounding spaces are ignored), an empty one, or the header sent twice with
different values, is refused (:class:`InvalidPriority`: the gateway answers 400 ``invalid_priority`` in the API's
own error shape). The Batch API's lines are always ``batch``.

Where an engine schedules by priority itself (vLLM's ``--scheduling-policy priority``, SGLang's
``--enable-priority-scheduling``), the class goes on as its per-request ``priority`` (:func:`engine_priority`:
``standard`` is the engines' default 0, so a client that talks to the engine directly ranks with standard traffic;
interactive -1 and batch 1 where lower values are served first, vLLM's order and SGLang's with
``--schedule-low-priority-values-first``; the signs turned where higher values are, SGLang's default).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from turnout.core.admission import Priority

__all__ = [
    "CLASSES",
    "HEADER",
    "Chosen",
    "InvalidPriority",
    "Ordering",
    "engine_priority",
    "key_class",
    "parse_class",
    "request_class",
    "tenant_default",
]

HEADER = "X-Turnout-Priority"
CLASSES: tuple[Priority, ...] = (Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH)  # first served first
_BY_NAME = {p.value: p for p in CLASSES}
_NAMES = ", ".join(p.value for p in CLASSES)
# vLLM's per-request priority (vllm/entrypoints/openai/chat_completion/protocol.py: "lower means earlier
# handling; default: 0"; vllm/v1/request.py orders waiting requests by (priority, arrival time)).
_ENGINE = {Priority.INTERACTIVE: -1, Priority.STANDARD: 0, Priority.BATCH: 1}
_SHOWN = 40  # characters of a refused value the message repeats


class Ordering(Enum):
    """Which per-request priority values an engine serves first."""

    LOW_FIRST = "low_first"  # vLLM; SGLang with --schedule-low-priority-values-first
    HIGH_FIRST = "high_first"  # SGLang's default (--enable-priority-scheduling alone)


class InvalidPriority(ValueError):
    """The header's value is not a class; the message names the header, the value and the classes."""


class Chosen(NamedTuple):
    """The class a request is served at; ``asked``: what its header said (None: no header); ``capped``: it asked
    for a class above its key's and was lowered to the key's."""

    priority: Priority
    asked: Priority | None = None
    capped: bool = False


def parse_class(text: str) -> Priority:
    """A class by its name (any case, surrounding spaces ignored); :class:`InvalidPriority` naming the classes."""
    found = _BY_NAME.get(text.strip().lower())
    if found is None:
        raise InvalidPriority(f"{_quoted(text)} is not a priority class: use {_NAMES}")
    return found


def tenant_default(configured: Priority | None, stored: Priority | None) -> Priority | None:
    """A tenant's default class: config.json's ``tenants.<t>.priority`` where it sets one, else the store's."""
    return configured if configured is not None else stored


def key_class(key: Priority | None, tenant: Priority | None) -> Priority:
    """The class of a key's requests before any header: its own, else its tenant's default, else standard."""
    if key is not None:
        return key
    return tenant if tenant is not None else Priority.STANDARD


def request_class(ceiling: Priority, header: Sequence[str]) -> Chosen:
    """The class one request is served at: ``ceiling`` (its key's class) unless ``header`` (every value of the
    request's :data:`HEADER`, in order) asks for a lower one. :class:`InvalidPriority` for a value that is not a
    class, or several that disagree."""
    if not header:
        return Chosen(ceiling)
    asked = [_header_value(value) for value in header]
    if any(a is not asked[0] for a in asked):
        raise InvalidPriority(f"{HEADER} was sent {len(asked)} times with different classes: send it once")
    wanted = asked[0]
    if wanted.rank < ceiling.rank:
        return Chosen(ceiling, wanted, capped=True)
    return Chosen(wanted, wanted)


def engine_priority(priority: Priority, ordering: Ordering = Ordering.LOW_FIRST) -> int:
    """The class as an engine's per-request ``priority``, for an engine that serves ``ordering``'s values first
    (standard is the engines' default, 0)."""
    value = _ENGINE[priority]
    return -value if ordering is Ordering.HIGH_FIRST else value


def _header_value(text: str) -> Priority:
    try:
        return parse_class(text)
    except InvalidPriority:
        raise InvalidPriority(f"{HEADER} must be one of {_NAMES} (got {_quoted(text)})") from None


def _quoted(text: str) -> str:
    shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return '"' + "".join(ch if ch.isprintable() else "?" for ch in shown) + '"'
