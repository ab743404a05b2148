"""Admission against per-key limits, in process or in Redis (shared by every gateway replica).

Both backends apply the rules of :mod:`turnout.core.limits`: a 60 s sliding window of admitted requests
and a per-UTC-day token budget with reservation at admission, settlement with real usage, refund on
failure. Limits are shared along a key's rotation chain (its lineage). The Redis backend does each step
in one Lua script, so concurrent requests on any number of replicas are counted exactly; while Redis is away each
replica counts its own share (:class:`RedisLimiter`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from turnout.core.limits import DAY_S, Decision, KeyLimitState, seconds_to_next_day
from turnout.errors import TurnoutError
from turnout.store.keys import KeyRecord

__all__ = ["LocalLimiter", "RateLimited", "RedisLimiter", "Subject", "TokenLimiter", "limit_headers"]

log = logging.getLogger("turnout.gateway")


class RateLimited(TurnoutError):
    status = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"


def limit_headers(d: Decision) -> dict[str, str]:
    """OpenAI-style ``x-ratelimit-*`` headers for a decision."""
    headers: dict[str, str] = {}
    if d.rpm_limit is not None:
        headers["x-ratelimit-limit-requests"] = str(d.rpm_limit)
        headers["x-ratelimit-remaining-requests"] = str(max(d.rpm_remaining or 0, 0))
        headers["x-ratelimit-reset-requests"] = f"{max(d.rpm_reset_s, 0):.0f}s"
    if d.tokens_limit is not None:
        headers["x-ratelimit-limit-tokens"] = str(d.tokens_limit)
        headers["x-ratelimit-remaining-tokens"] = str(max(d.tokens_remaining or 0, 0))
        headers["x-ratelimit-reset-tokens"] = f"{max(d.tokens_reset_s, 0):.0f}s"
    return headers


def refusal(d: Decision, label: str = "") -> RateLimited:
    err = RateLimited(label + d.reason, retry_after=d.retry_after)
    err.headers = limit_headers(d)
    return err


@dataclass(frozen=True, slots=True)
class Subject:
    """What a limit is counted against: a key's rotation chain, or a tenant."""

    id: str
    rpm: int | None
    daily_tokens: int | None
    label: str = ""  # prefix for refusal messages ('tenant "team-a": ')

    @classmethod
    def of_key(cls, key: KeyRecord) -> Subject:
        return cls(f"k{key.lineage}", key.rpm, key.daily_tokens)

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.daily_tokens is not None


class TokenLimiter(Protocol):
    async def admit(self, subject: Subject, estimate: int) -> Decision: ...
    async def settle(self, subject: Subject, decision: Decision, reserved: int, actual: int) -> None: ...
    async def release(self, subject: Subject, decision: Decision, reserved: int) -> None: ...
    async def close(self) -> None: ...


class LocalLimiter:
    """Exact within one process (admission runs on the event loop without awaiting in between)."""

    def __init__(self) -> None:
        self._states: dict[str, KeyLimitState] = {}

    async def admit(self, subject: Subject, estimate: int) -> Decision:
        state = self._states.setdefault(subject.id, KeyLimitState())
        decision = state.admit(time.time(), subject.rpm, subject.daily_tokens, estimate)
        if not decision.allowed:
            raise refusal(decision, subject.label)
        return decision

    async def settle(self, subject: Subject, decision: Decision, reserved: int, actual: int) -> None:
        if subject.daily_tokens is not None:
            self._states.setdefault(subject.id, KeyLimitState()).settle(decision.day, reserved, actual)

    async def release(self, subject: Subject, decision: Decision, reserved: int) -> None:
        self._states.setdefault(subject.id, KeyLimitState()).release(decision, reserved)

    async def close(self) -> None:
        pass


_ADMIT = """
local now, rpm, daily, est = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60)
local count = redis.call('ZCARD', KEYS[1])
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local reset = 0
if oldest[2] then reset = tonumber(oldest[2]) + 60 - now end
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if rpm >= 0 and count >= rpm then return {0, 1, count, used, tostring(reset)} end
if daily >= 0 and used + est > daily then return {0, 2, count, used, tostring(reset)} end
if rpm >= 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[5])
  redis.call('EXPIRE', KEYS[1], 61)
end
if daily >= 0 then
  used = redis.call('INCRBY', KEYS[2], est)
  redis.call('EXPIRE', KEYS[2], 172800)
end
return {1, 0, count + 1, used, tostring(reset)}
"""

_SETTLE = """
local v = redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
if v < 0 then redis.call('SET', KEYS[1], 0, 'KEEPTTL') end
return v
"""


class RedisLimiter:
    """Exact across every replica while Redis answers. Redis away or slow (a reply later than ``timeout_s``): each
    replica counts on its own, every limit cut to its share (the limit over ``replicas()``, the replicas last seen
    alive, at least one), says so once, and tries Redis again after ``retry_s``; what it counted meanwhile stays
    its own (not added to Redis's counts: nothing is counted twice)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnout",
        timeout_s: float = 0.25,
        replicas: Callable[[], int] = lambda: 1,
        retry_s: float = 1.0,
    ) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._prefix = prefix
        self._admit = self._redis.register_script(_ADMIT)
        self._settle = self._redis.register_script(_SETTLE)
        self.replicas = replicas  # the replicas last seen alive (the occupancy's keeper counts them)
        self._retry_s = retry_s
        self._local = LocalLimiter()
        self._away_since: float | None = None  # monotonic time Redis was found away (None: it answers)

    @property
    def up(self) -> bool:
        return self._away_since is None

    def _share(self, subject: Subject) -> Subject:
        n = max(self.replicas(), 1)

        def cut(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // n)

        return Subject(subject.id, cut(subject.rpm), cut(subject.daily_tokens), subject.label)

    def _away(self, exc: Exception) -> None:
        if self._away_since is None:
            log.warning(
                "rate and token limits: Redis unavailable (%s): counting on this replica, each limit cut to its share "
                "of %d replicas, until Redis answers again",
                exc,
                max(self.replicas(), 1),
            )
        self._away_since = time.monotonic()

    def _try_redis(self) -> bool:
        return self._away_since is None or time.monotonic() - self._away_since >= self._retry_s

    def _keys(self, subject: Subject, day: int) -> list[str]:
        return [f"{self._prefix}:rpm:{subject.id}", f"{self._prefix}:tok:{subject.id}:{day}"]

    async def admit(self, subject: Subject, estimate: int) -> Decision:
        import redis.exceptions

        now = time.time()
        day = int(now // DAY_S)
        rpm = -1 if subject.rpm is None else subject.rpm
        daily = -1 if subject.daily_tokens is None else subject.daily_tokens
        member = uuid.uuid4().hex
        if not self._try_redis():
            return await self._local.admit(self._share(subject), estimate)
        try:
            ok, why, count, used, reset = await self._admit(
                keys=self._keys(subject, day), args=[now, rpm, daily, estimate, member]
            )
        except redis.exceptions.RedisError as exc:
            self._away(exc)
            return await self._local.admit(self._share(subject), estimate)
        if self._away_since is not None:
            self._away_since = None
            log.info("rate and token limits: Redis answers again; counted there again")
        rpm_reset = float(reset)
        day_reset = seconds_to_next_day(now)
        decision = Decision(
            allowed=bool(ok),
            rpm_limit=subject.rpm,
            rpm_remaining=None if subject.rpm is None else subject.rpm - int(count),
            rpm_reset_s=rpm_reset,
            tokens_limit=subject.daily_tokens,
            tokens_remaining=None if subject.daily_tokens is None else subject.daily_tokens - int(used),
            tokens_reset_s=day_reset,
            day=day,
            at=now,
            member=member,
        )
        if ok:
            return decision
        if int(why) == 1:
            reason, wait = f"rate limit of {subject.rpm} requests per minute reached", rpm_reset
        else:
            reason = (
                f"daily token limit of {subject.daily_tokens} reached ({int(used)} used or reserved, "
                f"this request needs ~{estimate})"
            )
            wait = day_reset
        raise refusal(decision._replace(reason=reason, retry_after=max(1, math.ceil(wait))), subject.label)

    async def settle(self, subject: Subject, decision: Decision, reserved: int, actual: int) -> None:
        import redis.exceptions

        if not decision.member:  # admitted on this replica while Redis was away
            await self._local.settle(self._share(subject), decision, reserved, actual)
            return
        if subject.daily_tokens is None or actual == reserved:
            return
        # A lost settlement only errs on the strict side: the reservation stays counted.
        with contextlib.suppress(redis.exceptions.RedisError):
            await self._settle(keys=[self._keys(subject, decision.day)[1]], args=[actual - reserved])

    async def release(self, subject: Subject, decision: Decision, reserved: int) -> None:
        import redis.exceptions

        if not decision.member:
            await self._local.release(self._share(subject), decision, reserved)
            return
        with contextlib.suppress(redis.exceptions.RedisError):
            await self._redis.zrem(self._keys(subject, decision.day)[0], decision.member)
        await self.settle(subject, decision, reserved, 0)

    async def close(self) -> None:
        await self._redis.aclose()
