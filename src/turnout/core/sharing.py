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
the answer's time, from the gateway's own count, to the nearest whole number: :func:`level`): the levels seen
recently say ``s``, fitted over all of them (:func:`fitted`), whether or not any answer was ever alone (an engine
under constant load learns it too). Until it is learned an engine is taken to share its
speed (:data:`ASSUMED`: 1), as :mod:`turnout.core.parallelism` takes one at a time until there is evidence: the
mistake that way spreads requests a little more than needed; the other left an engine idle.

What routing does with it (:func:`turnout.core.routing.expected_seconds`):

- a request sent to an engine with a free slot and ``k`` requests in flight takes its own work plus ``s`` times
  the part of theirs that overlaps it (:func:`overlap`: with ``s`` 1, every second of their work left, up to its
  own length each, is a second it waits in turn);
- a request that finds every slot busy waits for the queue ahead at the engine's throughput, ``slots / (1 +
  s * (slots - 1))`` requests' worth of work at once (:func:`throughput`), then runs beside the others.

And batch headroom (:mod:`turnout.core.headroom`) counts an engine's slots at full speed (:func:`full_speed`: where
its sharing is learned), since a free slot beside batch requests on a time-shared engine is no headroom.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "ASSUMED",
    "MAX_SHARING",
    "MIN_SPREAD",
    "Company",
    "fitted",
    "full_speed",
    "level",
    "overlap",
    "throughput",
]

# Levels of company tell the sharing only when their answers' mean company spans at least this much.
MIN_SPREAD = 0.5
# What an engine whose sharing is not learned is taken to do: share its speed between what it runs at once.
ASSUMED = 1.0
# Learned values are kept within [0, MAX_SHARING] (above 1: slower together than in turn, as an engine whose slots
# evict each other's cache can be; one odd answer never makes it more than that).
MAX_SHARING = 2.0


def level(beside: float) -> int:
    """The level an answer with ``beside`` others in flight on average is filed under: the nearest whole number."""
    return int(max(beside, 0.0) + 0.5)


class Company(NamedTuple):
    """One level of company's answers (:func:`level`): their mean company (others in flight beside them), their
    decode rate (tokens/s) and how many answers taught them (the weight)."""

    beside: float
    rate: float
    answers: int


def fitted(levels: Iterable[Company]) -> float | None:
    """The sharing the answers' levels of company say: ``1 / rate = (1 + s * beside) / alone`` is a line in
    ``beside``, fitted by least squares weighted by each level's answers; ``s`` is its slope over its intercept
    (the alone rate is not needed, so an engine that is never idle learns it too; with two levels it goes through
    both). None where the company seen spans less than :data:`MIN_SPREAD` or a rate is missing; kept within [0,
    :data:`MAX_SHARING`]."""
    points = [(c.beside, 1.0 / c.rate, float(max(c.answers, 1))) for c in levels if c.rate > 0]
    if not points or max(p[0] for p in points) - min(p[0] for p in points) < MIN_SPREAD:
        return None
    weight = sum(w for _, _, w in points)
    mean_x = sum(x * w for x, _, w in points) / weight
    mean_y = sum(y * w for _, y, w in points) / weight
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    slope = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread
    intercept = mean_y - slope * mean_x
    if intercept <= 0:  # slower with company than the model allows (or faster alone than possible): a bound
        return MAX_SHARING if slope > 0 else 0.0
    return min(max(slope / intercept, 0.0), MAX_SHARING)


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


def full_speed(slots: int | None, sharing: float | None) -> int | None:
    """What an engine running ``slots`` at once gets through, in requests at full speed (at least one): the slots
    themselves where its sharing is not learned (``None``) or the slots are not known (``None``, returned as it is).
    What headroom keeps for interactive requests is counted in these (:mod:`turnout.core.headroom`): a free slot
    beside batch requests on a time-shared engine is no headroom."""
    if slots is None or sharing is None or slots < 2:
        return slots
    return max(1, round(throughput(slots, sharing)))
