"""Parallelism: how many requests an engine runs at once for one model, and how that was found.

Routing needs it to see an engine's own queue: a request sent to an engine whose slots are all busy waits there
for one of them, and an engine taken to batch more than it does hides that wait (requests pile up behind a busy
engine while another one idles). So each (worker, model) has one figure, from the strongest source there is
(:func:`effective`):

- **declared**: ``workers[].slots`` in the config (the operator said so);
- **engine**: the engine says it itself: llama.cpp's server in ``/props`` (``total_slots``); vLLM and SGLang, known
  by their model listing, are batching engines whose capacity shows once their own queue gauge is non-zero (the
  running count then) and is unknown (``None``: a batching engine) until it does;
- **learned**: from what the engine did. Two answers that were being generated at the same time ran at once:
  their token streams overlapped, or the spans the engine's own timings say it worked on them did
  (:func:`depth`). The most answers seen running together, seen at least :data:`CONFIRMATIONS` times within
  :data:`EVIDENCE_TTL_S`, is the figure (:class:`Evidence`);
- **assumed**: one at a time until there is evidence. Taking a one-at-a-time engine (Ollama with
  ``OLLAMA_NUM_PARALLEL=1``, llama-cpp-python's server, LM Studio, mlx_lm) for a batching one leaves requests
  queued in it while others idle; taking a batching engine for a one-at-a-time one only spreads load a little
  more than needed (and costs some prefix affinity) until its overlapping answers show what it runs.

Overlap is judged with a margin (:data:`OVERLAP_MARGIN_S`): the gateway reads each stream when its event loop gets
to it, so the last token of one answer and the first of the next on a one-at-a-time engine can be read in either
order within one turn of the loop; a margin far above that turn's length and far below any real answer's time
makes that noise count for nothing.

Pure: times are parameters (seconds on one monotonic clock); no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "ASSUMED",
    "CONFIRMATIONS",
    "EVIDENCE_TTL_S",
    "OVERLAP_MARGIN_S",
    "Evidence",
    "Parallelism",
    "Source",
    "Span",
    "depth",
    "effective",
    "engine_capacity",
]

# Two answers count as running at once when their spans overlap by more than this (see the module's docstring).
OVERLAP_MARGIN_S = 0.025
# A level of parallelism counts once seen this many times (one odd reading never raises it) ...
CONFIRMATIONS = 2
# ... within this long (an engine restarted with other settings is learned again; an hour of evidence is kept).
EVIDENCE_TTL_S = 3600.0
# Requests that were sent while another ran there and started only after it ended, before "one at a time" is said
# to be learned rather than assumed.
WAITS_TO_LEARN_ONE = 3


class Source(StrEnum):
    DECLARED = "declared"
    ENGINE = "engine"
    LEARNED = "learned"
    ASSUMED = "assumed"


class Parallelism(NamedTuple):
    """What routing takes an engine to run at once for one model. ``slots`` None: a batching engine whose capacity
    is not known (vLLM, SGLang before their queue showed it)."""

    slots: int | None
    source: Source
    why: str  # how it was found, for people (the inventory, the Overview, ``turnout worker list``)
    # the engine's own setting (llama.cpp's total_slots), not a reading of its gauges: nothing learned overrides it
    exact: bool = False

    def to_json(self) -> dict[str, object]:
        return {"slots": self.slots, "source": self.source.value, "why": self.why}


ASSUMED = Parallelism(1, Source.ASSUMED, "one at a time until answers are seen running together")


class Span(NamedTuple):
    """One answer on one worker: when it was sent, and when the engine was seen working on it (its first and last
    tokens read, or the span its own timings give). ``first`` None: not known (an answer in one piece, no
    timings)."""

    sent: float
    first: float | None
    last: float


def depth(span: Span, others: Iterable[Span], margin: float = OVERLAP_MARGIN_S) -> int:
    """The most answers running at one instant within ``span``, itself included: each span trimmed by half the
    margin at both ends (so two count together only when they overlap by more than the margin), then the deepest
    point. 1 for a span with no known start, or shorter than the margin."""
    if span.first is None:
        return 1
    lo, hi = span.first + margin / 2, span.last - margin / 2
    if hi <= lo:
        return 1
    edges: list[tuple[float, int]] = []
    for other in others:
        if other.first is None or other is span:
            continue
        start, end = max(other.first + margin / 2, lo), min(other.last - margin / 2, hi)
        if end > start:
            edges.append((start, 1))
            edges.append((end, -1))
    if not edges:
        return 1
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # an end before a start at the same instant
    deepest = running = 0
    for _, step in edges:
        running += step
        deepest = max(deepest, running)
    return 1 + deepest


def waited(span: Span, others: Iterable[Span]) -> bool:
    """``span`` was sent while another answer was being generated there and was seen starting only after every
    such answer had ended, most of its wait past their ends: it waited for them (a one-at-a-time engine's sign)."""
    if span.first is None:
        return False
    ahead = [o for o in others if o.first is not None and o is not span and o.first <= span.sent < o.last]
    if not ahead:
        return False
    freed = max(o.last for o in ahead)
    return span.first >= freed and freed - span.sent >= span.first - freed


@dataclass(slots=True)
class Evidence:
    """What one (worker, model) has shown of its parallelism: each level seen, how often and when last; and how
    many requests were seen waiting for the one before them."""

    seen: dict[int, tuple[int, float]] = field(default_factory=dict)  # level -> (times seen, when last)
    waits: int = 0
    # what other gateway replicas saw of the same engine: level -> (times, when last, on this process's clock)
    peers: dict[int, tuple[int, float]] = field(default_factory=dict)

    def observe(self, level: int, now: float) -> None:
        """``level`` answers were seen running at once (every lower level was too)."""
        if level < 2:
            return
        count, _ = self.seen.get(level, (0, now))
        self.seen[level] = (count + 1, now)

    def observe_wait(self) -> None:
        self.waits += 1

    def forget(self) -> None:
        """The engine may have restarted with other settings (its worker went down and came back)."""
        self.seen.clear()
        self.peers.clear()
        self.waits = 0

    def learned(self, now: float, ttl_s: float = EVIDENCE_TTL_S) -> Parallelism | None:
        """The most answers seen running at once, confirmed (:data:`CONFIRMATIONS`, counting the sightings at
        that level and above) within ``ttl_s``; one at a time once requests were seen waiting and none ran
        together; None without evidence."""
        fresh: dict[int, int] = {}
        for seen in (self.seen, self.peers):
            for level, (count, at) in seen.items():
                if now - at <= ttl_s:
                    fresh[level] = fresh.get(level, 0) + count
        total = 0
        for level in sorted(fresh, reverse=True):
            total += fresh[level]
            if total >= CONFIRMATIONS:
                return Parallelism(level, Source.LEARNED, f"seen running {level} at once")
        if self.waits >= WAITS_TO_LEARN_ONE and not fresh:
            return Parallelism(1, Source.LEARNED, f"one at a time: {self.waits} requests waited for the one before")
        return None


def engine_capacity(family: str, running: int | None, waiting: int | None, seen_running: int) -> Parallelism:
    """A batching engine's parallelism from its own gauges (vLLM's ``num_requests_running``/``_waiting``, SGLang's
    ``num_running_reqs``/``num_queue_reqs``): with requests waiting in its queue, the running count is what it runs
    at once; without, it is a batching engine of unknown capacity that was seen running ``seen_running``."""
    if waiting and running:
        return Parallelism(running, Source.ENGINE, f"{family}: {running} running while {waiting} waited in its queue")
    seen = f", seen running {seen_running}" if seen_running > 1 else ""
    return Parallelism(None, Source.ENGINE, f"{family}: a batching engine{seen}")


def effective(declared: int | None, engine: Parallelism | None, evidence: Evidence | None, now: float) -> Parallelism:
    """The figure routing uses, from the strongest source there is (see the module's docstring). A learned level
    above what a batching engine's gauges showed raises nothing: that engine is taken to batch; nor does one above
    the engine's own setting (``exact``: llama.cpp's total_slots): answers seen overlapping there overlapped in
    the gateway's reading (a loaded machine reads an answer's end late), not in the engine."""
    if declared is not None:
        return Parallelism(declared, Source.DECLARED, "workers[].slots in the config")
    if engine is not None:
        if engine.slots is not None and evidence is not None:
            learned = evidence.learned(now)
            if learned is not None and learned.slots is not None and learned.slots > engine.slots and not engine.exact:
                return learned  # it ran more at once since its gauges were read (read mid-way)
        return engine
    learned = evidence.learned(now) if evidence is not None else None
    return learned if learned is not None else ASSUMED
