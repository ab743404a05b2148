"""Sharing: how much the requests an engine runs at once slow each other down.

An engine that runs several requests at once (llama.cpp's slots: four unless told otherwise; Ollama's
``OLLAMA_NUM_PARALLEL``; a declared ``slots``) does not run each of them as fast as it runs one alone. On a GPU,
batching is nearly free up to its memory bandwidth; on a CPU thread the requests take turns, each at a fraction of
the speed. Routing that took a free slot for a free engine sent a request to an engine already at work beside an
idle one (measured: three four-slot llama.cpp engines, one CPU thread each, three interactive clients: 58 % of
their tokens on one engine and 5 % on another, time to first token p90 0.48 s against 0.24 s with this counted;
bench/README.md, "A free slot is not an idle engine").

One figure per (worker, model), **sharing** ``s``: a request generated beside ``n`` others runs at its alone speed
divided by ``1 + s * n``. ``s`` 0: batching costs nothing (each runs at full speed); ``s`` 1: the engine's
throughput is fixed and shared (time-sharing). It is learned from the answers' own decode rates (tokens after the
first, per second of generation): those generated with nobody beside them teach the **alone** rate, those
generated beside others (the mean number in flight there over the answer's time, from the gateway's own count)
teach ``s = (alone / rate - 1) / beside`` (:func:`taught`). Until it is learned an engine is taken to share its
speed (:data:`ASSUMED`: 1), as :mod:`turnout.core.parallelism` takes one at a time until there is evidence: the
mistake that way spreads requests a little more than needed; the other left an engine idle.

What routing does with it (:func:`turnout.core.routing.expected_seconds`):

- a request sent to an engine with a free slot and ``k`` requests in flight takes its own work plus ``s`` times
  the part of theirs that overlaps it (:func:`overlap`: with ``s`` 1, every second of their work left, up to its
  own length each, is a second it waits in turn);
- a request that finds every slot busy waits for the queue ahead at the engine's throughput, ``slots / (1 +
  s * (slots - 1))`` requests' worth of work at once (:func:`throughput`), then runs beside the others.

Pure: no I/O, no clock.
"""

from __future__ import annotations

__all__ = [
    "ALONE_BESIDE",
    "ASSUMED",
    "MAX_SHARING",
    "SHARED_BESIDE",
    "overlap",
    "taught",
    "throughput",
]

# An answer teaches the alone rate when fewer than this many others were in flight beside it on average ...
ALONE_BESIDE = 0.25
# ... and teaches sharing when at least this many were (in between: neither, it was mostly alone but not quite).
SHARED_BESIDE = 0.5
# What an engine whose sharing is not learned is taken to do: share its speed between what it runs at once.
ASSUMED = 1.0
# Learned values are kept within [0, MAX_SHARING] (above 1: slower together than in turn, as an engine whose slots
# evict each other's cache can be; one odd answer never makes it more than that).
MAX_SHARING = 2.0


def taught(alone: float | None, rate: float | None, beside: float) -> float | None:
    """The sharing one answer teaches: generated at ``rate`` tokens/s with ``beside`` others in flight on average,
    where the engine alone generates at ``alone``; None where it teaches none (no alone rate yet, no rate, or too
    few beside it)."""
    if alone is None or not rate or rate <= 0 or alone <= 0 or beside < SHARED_BESIDE:
        return None
    return min(max((alone / rate - 1.0) / beside, 0.0), MAX_SHARING)


def overlap(sharing: float, others_left_s: float, others: int, own_s: float) -> float:
    """How much longer a request of ``own_s`` seconds (alone) takes beside ``others`` requests with
    ``others_left_s`` seconds of work left between them: ``sharing`` times the part of their work that overlaps its
    own, at most ``own_s`` of each one's (time-sharing with ``sharing`` 1: a job that ends first costs what it had
    left; one that outlasts it costs its whole length)."""
    if others <= 0 or sharing <= 0.0:
        return 0.0
    return min(sharing, MAX_SHARING) * min(max(others_left_s, 0.0), others * max(own_s, 0.0))


def throughput(slots: int, sharing: float) -> float:
    """Requests' worth of work an engine running ``slots`` at once gets through per second of one alone: ``slots``
    with batching for free (``sharing`` 0), one when its speed is shared (1)."""
    return slots / (1.0 + min(max(sharing, 0.0), MAX_SHARING) * (slots - 1))
