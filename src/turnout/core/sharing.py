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
first, per second of generation), filed by the company they had (the mean number of others in flight there over
the answer's time, from the gateway's own count, to the nearest whole number: :func:`level`): the least and the
most company seen recently say ``s`` (:func:`between`), whether or not any answer was ever alone (an engine under
constant load learns it too). Until it is learned an engine is taken to share its
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
    "ASSUMED",
    "MAX_SHARING",
    "MIN_SPREAD",
    "between",
    "level",
    "overlap",
    "throughput",
]

# Two levels of company tell the sharing only when their answers' mean company differs by at least this much.
MIN_SPREAD = 0.5
# What an engine whose sharing is not learned is taken to do: share its speed between what it runs at once.
ASSUMED = 1.0
# Learned values are kept within [0, MAX_SHARING] (above 1: slower together than in turn, as an engine whose slots
# evict each other's cache can be; one odd answer never makes it more than that).
MAX_SHARING = 2.0


def level(beside: float) -> int:
    """The level an answer with ``beside`` others in flight on average is filed under: the nearest whole number."""
    return int(max(beside, 0.0) + 0.5)


def between(lo: tuple[float, float], hi: tuple[float, float]) -> float | None:
    """The sharing two levels of company say, each ``(beside, rate)``: the mean number of others in flight beside
    the answers, and their decode rate (tokens/s). With ``rate = alone / (1 + s * beside)`` at both, ``s`` is
    ``(r_lo / r_hi - 1) / (b_hi - b_lo * r_lo / r_hi)``: the alone rate is not needed, so an engine never idle
    learns it too. None where the two are too close in company to tell (:data:`MIN_SPREAD`) or a rate is missing;
    kept within [0, :data:`MAX_SHARING`]."""
    (b_lo, r_lo), (b_hi, r_hi) = lo, hi
    if b_hi - b_lo < MIN_SPREAD or r_lo <= 0 or r_hi <= 0:
        return None
    ratio = r_lo / r_hi
    denominator = b_hi - b_lo * ratio
    if denominator <= 0:  # far slower with a little more company than the model allows: the bound
        return MAX_SHARING if ratio > 1 else 0.0
    return min(max((ratio - 1.0) / denominator, 0.0), MAX_SHARING)


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
