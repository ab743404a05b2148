"""Per-key limits: requests per minute (sliding window) and tokens per UTC day (reserve/settle/refund).

Pure state machines: the caller passes ``now`` and keeps one :class:`KeyLimitState` per key lineage.
The Redis backend implements the same rules in Lua scripts (see ``turnout.gateway.limiter``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "BYTES_PER_TOKEN",
    "DAY_S",
    "WINDOW_S",
    "Decision",
    "KeyLimitState",
    "completion_budget",
    "decide",
    "estimate_tokens",
    "learn_bytes_per_token",
    "prompt_estimate",
    "seconds_to_next_day",
]

WINDOW_S = 60.0
DAY_S = 86_400.0


class Decision(NamedTuple):
    """Outcome of one admission. ``retry_after`` is set when refused. (A named tuple: one is made for every
    admission of a limited key, and a frozen dataclass costs several times as much to make.)"""

    allowed: bool
    reason: str = ""
    retry_after: int = 0
    rpm_limit: int | None = None
    rpm_remaining: int | None = None
    rpm_reset_s: float = 0.0
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float = 0.0
    day: int = -1  # the UTC day a reservation was made on; settle/refund only touch that day
    at: float = 0.0  # admission time (to take the request back out of the window)
    member: str = ""  # the backend's id of this admission (Redis sorted-set member)


def seconds_to_next_day(now: float) -> float:
    return (math.floor(now / DAY_S) + 1) * DAY_S - now


BYTES_PER_TOKEN = 4  # a request body's bytes per prompt token, before a model's own figure is learned
_RATIO_BOUNDS = (1.0, 64.0)  # a learned figure outside these says more about the sample than about the model
_LEARN_WEIGHT = 0.3  # of each new sample in the learned figure (an exponentially weighted mean)


def prompt_estimate(body_bytes: int, bytes_per_token: float | None = None) -> int:
    """The prompt's tokens for a request body of ``body_bytes``: the body's size over the model's learned bytes
    per token (:func:`learn_bytes_per_token`), rounded, else over :data:`BYTES_PER_TOKEN`; at least 1."""
    if not bytes_per_token:
        return max(1, body_bytes // BYTES_PER_TOKEN)
    return max(1, round(body_bytes / bytes_per_token))


def learn_bytes_per_token(previous: float | None, body_bytes: int, prompt_tokens: int) -> float | None:
    """The model's bytes of request body per prompt token after one more answer whose worker counted
    ``prompt_tokens`` (a weighted mean that follows the latest answers; the body carries the request's framing
    as well as its text, and the chat template adds tokens of its own: the figure takes in both). Unchanged for
    a count of 0."""
    if prompt_tokens <= 0 or body_bytes <= 0:
        return previous
    low, high = _RATIO_BOUNDS
    sample = min(max(body_bytes / prompt_tokens, low), high)
    return sample if previous is None else previous + _LEARN_WEIGHT * (sample - previous)


def completion_budget(max_tokens: int | None, default_completion: int) -> int:
    """The completion a request may produce: what it asks for at most, else ``default_completion``."""
    return max_tokens if max_tokens is not None and max_tokens > 0 else default_completion


def estimate_tokens(
    body_bytes: int, max_tokens: int | None, default_completion: int, bytes_per_token: float | None = None
) -> int:
    """Reservation for a request: its :func:`prompt_estimate` plus the completion it may produce."""
    return prompt_estimate(body_bytes, bytes_per_token) + completion_budget(max_tokens, default_completion)


def decide(
    now: float,
    rpm: int | None,
    daily: int | None,
    estimate: int,
    *,
    in_window: int,
    oldest: float | None,
    used: int,
) -> Decision:
    """Admit or refuse one request, given the subject's counts at ``now``: ``in_window`` admissions in the last
    minute (the oldest at ``oldest``) and ``used`` tokens settled or reserved today. The caller records an
    admission (window entry, ``used += estimate`` when ``daily`` is set) when the decision allows it.
    :class:`KeyLimitState` decides here, in one process or in the supervisor of `turnout serve --workers N`
    (``turnout.gateway.shared_limits``)."""
    rpm_reset = (oldest + WINDOW_S - now) if oldest is not None else 0.0
    day_reset = seconds_to_next_day(now)
    if rpm is not None and in_window >= rpm:
        return Decision(
            False,
            f"rate limit of {rpm} requests per minute reached",
            max(1, math.ceil(rpm_reset)),
            rpm,
            0,
            rpm_reset,
            daily,
            None if daily is None else max(daily - used, 0),
            day_reset,
        )
    if daily is not None and used + estimate > daily:
        return Decision(
            False,
            f"daily token limit of {daily} reached ({used} used or reserved, this request needs ~{estimate})",
            max(1, math.ceil(day_reset)),
            rpm,
            None if rpm is None else rpm - in_window,
            rpm_reset,
            daily,
            max(daily - used, 0),
            day_reset,
        )
    used_after = used + estimate if daily is not None else used
    return Decision(
        allowed=True,
        rpm_limit=rpm,
        rpm_remaining=None if rpm is None else rpm - in_window - 1,
        rpm_reset_s=rpm_reset or WINDOW_S,
        tokens_limit=daily,
        tokens_remaining=None if daily is None else daily - used_after,
        tokens_reset_s=day_reset,
        day=int(now // DAY_S),
        at=now,
    )


@dataclass(slots=True)
class KeyLimitState:
    admitted: deque[float] = field(default_factory=deque)  # admission times inside the window
    day: int = -1
    used: int = 0  # tokens settled + reserved today

    def admit(self, now: float, rpm: int | None, daily: int | None, estimate: int) -> Decision:
        while self.admitted and self.admitted[0] <= now - WINDOW_S:
            self.admitted.popleft()
        today = int(now // DAY_S)
        if today != self.day:
            self.day, self.used = today, 0
        oldest = self.admitted[0] if self.admitted else None
        decision = decide(now, rpm, daily, estimate, in_window=len(self.admitted), oldest=oldest, used=self.used)
        if decision.allowed:
            if rpm is not None:  # counted against a rate only where one applies (a Batch API line: never)
                self.admitted.append(now)
            if daily is not None:
                self.used += estimate
        return decision

    def settle(self, day: int, reserved: int, actual: int) -> None:
        """Replace a reservation by the real count. A reservation from an earlier day is dropped: that
        day's budget is gone and the new day starts from zero."""
        if day == self.day:
            self.used = max(0, self.used - reserved + actual)

    def refund(self, day: int, reserved: int) -> None:
        self.settle(day, reserved, 0)

    def release(self, decision: Decision, reserved: int) -> None:
        """Undo an admission entirely (another limit refused the same request): window slot and tokens."""
        if decision.at in self.admitted:
            self.admitted.remove(decision.at)
        self.refund(decision.day, reserved)
