"""Headroom: how many slots batch requests may hold, so that an interactive or standard request starts at once.

Batch requests (the Batch API's lines, keys of class ``batch``) run on what other traffic leaves. Without
preempting an engine's running request, the only way to leave an interactive request a free slot is to keep batch
off some slots beforehand:

- **each worker**: at most ``routing.batch_share`` of the slots its engine runs at once (at least one), counted at
  full speed: where its slots are learned to share its speed (CPU threads, :mod:`turnout.core.sharing`), a free
  slot beside batch requests is no headroom, so four time-shared slots count as one (three four-slot one-thread
  llama.cpp engines kept two slots each free and a turn beside two lines took 1.9x its time alone);
- **the model's workers together**: at most that share of all their slots (at least one), or more: every slot that
  the model's other traffic has not needed lately (its peak in flight over :data:`QUIET_S`). On engines that run
  one request at a time a worker's share is the whole engine; the fleet's share is what keeps some engines free.
- **nothing else wanted the model lately** (no interactive or standard request for it in flight over
  :data:`QUIET_S`, a gateway just started included): batch takes every slot. The first request after a quiet
  spell finds them all taken (it stops a Batch API line: :mod:`turnout.core.preemption`); from then on the slots
  it needed are kept free as the batch requests holding them end.
- **never more than a worker's slots**, whatever the share (where its engine says how many it runs at once): a
  batch request beyond them would wait in the engine's own queue, where no later request can pass it or stop it
  before it starts (bench/batch_fleet.py with ``batch_share`` 1: eight lines on three one-slot engines, and
  interactive requests waited 1.4 s for the lines queued ahead of them in the engines). It waits in the
  gateway's queue instead, behind every other class. (The dispatcher goes further: a batch request goes only to a
  worker with a free slot, whatever holds the others, except where the engine orders its own queue by priority.)

Pure: no I/O, no clock (times are parameters).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

__all__ = ["QUIET_S", "RecentPeak", "batch_caps", "batch_room"]

# How far back the other traffic's need is remembered: a person's next message in a conversation, or an agent's next
# turn, comes within minutes; a batch that waited for a slot this long was not in anyone's way.
QUIET_S = 300.0


def batch_room(slots: Iterable[int | None], share: float) -> int | None:
    """``share`` of these slots, at least one; None (no cap) when the share is whole or a capacity is unknown (a
    batching engine with no ``max_concurrent``)."""
    if share >= 1:
        return None
    total = 0
    for n in slots:
        if n is None:
            return None
        total += n
    return max(1, math.floor(total * share))


def batch_caps(
    worker: int | None, fleet: list[int | None] | None, share: float, others: int, speed: int | None = None
) -> tuple[int | None, int | None]:
    """What batch requests may hold of one worker's slots (``worker``: what its engine runs at once; None: not
    known) and of the model's workers' slots together (``fleet``: each one's, counted at full speed; None: not
    asked, a single candidate). ``others``: the model's other traffic's peak in flight over :data:`QUIET_S`.
    ``speed``: what ``worker``'s engine gets through at full speed, where fewer than its slots
    (:func:`turnout.core.sharing.full_speed`; None: its slots): the shares are of that. (None: no cap.)"""
    if others == 0 or share >= 1:
        return worker, None
    mine = batch_room([worker if speed is None else speed], share)
    if fleet is None:
        return mine, None
    together = batch_room(fleet, share)
    if together is not None:
        total = sum(n or 0 for n in fleet)
        together = max(together, total - others)
    return mine, together


class RecentPeak:
    """The most seen at once over the last ``window_s`` (0: nothing seen): ``see`` each count as it is read (at each
    routed request)."""

    __slots__ = ("_seen", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, int]] = deque()  # (when, count), counts decreasing from the left

    def see(self, count: int, now: float) -> None:
        while self._seen and self._seen[-1][1] <= count:
            self._seen.pop()
        self._seen.append((now, count))
        self._drop(now)

    def peak(self, now: float) -> int:
        self._drop(now)
        return self._seen[0][1] if self._seen else 0

    def _drop(self, now: float) -> None:
        while self._seen and now - self._seen[0][0] > self.window_s:
            self._seen.popleft()
