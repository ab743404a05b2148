"""Holding a request while its model gets ready, instead of answering 503 at once.

A request for a claimed model that is asleep (a wake is sent), waking, activating or still scheduling waits in its
model's queue (:meth:`turnout.gateway.dispatch.Dispatcher.hold`) until the claim's engine is bound, for at most
``routing.hold_s``; so does a request whose only workers are down but were healthy within the last minute (a restart:
:meth:`~turnout.gateway.dispatch.Dispatcher.acquire`'s ``hold_s``). Past the limit it gets the answer it would have
had at once (the claim's 503 with ``Retry-After``), and its place in the queue is given back. A failed claim, a model
never installed, blocked by placement, or on a worker gone for long is answered at once. A client that would
rather retry itself says so per request (:data:`HOLD_HEADER`).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["HOLDABLE", "HOLD_HEADER", "hold_limit"]

HOLD_HEADER = "X-Turnout-Hold"  # "0" (or "no", "false"): answer at once instead of holding; seconds: at most that
HOLDABLE = frozenset({"model_waking", "model_activating"})  # the claim answers these while it gets ready


def hold_limit(headers: Mapping[str, str], default_s: float) -> float:
    """How long this request may be held: ``routing.hold_s``, or less when its :data:`HOLD_HEADER` asks (never
    more; a value that is not a number or ``no``/``false`` is the default)."""
    asked = headers.get(HOLD_HEADER)
    if asked is None:
        return default_s
    text = asked.strip().lower()
    if text in ("no", "false", "off"):
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        return default_s
    return min(max(seconds, 0.0), default_s) if seconds == seconds else default_s
