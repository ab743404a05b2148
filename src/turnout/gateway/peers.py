"""The other gateway processes and replicas: their admin changes picked up, ours announced.

A process that changes placement, keys, endpoints, model aliases or people through the admin API announces it
before answering, on two channels:

- the processes on one data dir (`turnout serve --workers N`, replicas sharing the dir) share a
  :class:`~turnout.state.changes.ChangeCounter` (a mapped file), which each checks at the start of every request
  (a memory read): there a change is in force for the next request;
- every replica, on any machine, shares the store's change version (:mod:`turnout.store.shared_state`), which
  each reads every :data:`POLL_S` (one primary-key read) and, with ``storage.redis_url`` set, also hears of at
  once on the Redis channel :data:`CHANNEL`: there a change is in force within a second (a few milliseconds
  with Redis; the poll still runs, so a lost message or a Redis outage costs at most :data:`POLL_S`).

When either moved, the process re-reads what it keeps in memory once (concurrent requests wait for that one
re-read). A re-read that fails is tried again at the next poll. Used by :mod:`turnout.wiring` and the request
frame (:mod:`turnout.gateway.frame`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from turnout.errors import TurnoutError
from turnout.state.changes import ChangeCounter
from turnout.store.db import StoreError
from turnout.store.shared_state import SharedState

__all__ = ["CHANNEL", "POLL_S", "Peers"]

log = logging.getLogger("turnout.gateway")

POLL_S = 0.5  # how often each gateway reads the store's change version
CHANNEL = "turnout:changes"  # the Redis channel every admin change is published on (the new version)
_RESUBSCRIBE_S = 5.0  # after Redis failed: how long the poll alone carries on before subscribing again


class Peers:
    def __init__(
        self,
        reload: Callable[[], Awaitable[None]],
        *,
        counter: ChangeCounter | None,
        shared: SharedState | None,
        redis_url: str | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.counter = counter
        self.shared = shared
        self.poll_s = poll_s
        self.seen_version: int | None = None  # the store's change version this process is up to date with
        self._reload = reload
        self._pending: asyncio.Future[bool] | None = None
        self._redis_url = redis_url
        self._redis: Any = None
        self._subscription: Any = None
        self._redis_down = False
        self._store_down = False
        self._failed_version: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._reading: asyncio.Future[int] | None = None  # the watch's read of the store's version, under way
        self._quiet = 0  # inside quiet(): the watch reads nothing

    # -- the request path --------------------------------------------------------------------------
    def moved(self) -> bool:
        """True when another process on this data dir changed something since this one last caught up."""
        return self.counter is not None and self.counter.moved()

    async def catch_up(self, version: int | None = None) -> None:
        """Re-read what this process keeps (once, however many requests wait for it); ``version``: the store's
        change version read just before, which this process is then up to date with."""
        if self._pending is None:
            value = None if self.counter is None else self.counter.value()
            self._pending = asyncio.ensure_future(self._run(value, version))
        await asyncio.shield(self._pending)

    async def _run(self, value: int | None, version: int | None) -> bool:
        try:
            await self._reload()
        except Exception:  # keep serving with what this process has; the next poll tries again
            if version is None or version != self._failed_version:
                log.exception("could not re-read the state another gateway changed (tried again shortly)")
            self._failed_version = version
            return False
        finally:
            if value is not None and self.counter is not None:
                self.counter.caught_up(value)
            self._pending = None
        if version is not None:
            self.seen_version = version
        self._failed_version = None
        return True

    async def announce(self) -> None:
        """Tell every other process and replica that an admin change was written (after it was). Raises
        TurnoutError when the store cannot take the announcement (the change itself is made)."""
        if self.counter is not None:
            self.counter.bump()
        if self.shared is None:
            return
        before = self.seen_version
        try:
            version = await asyncio.to_thread(self.shared.bump_changes, now=time.time())
        except StoreError as exc:
            raise TurnoutError(
                f"the change was made, but the other gateway replicas could not be told through the store ({exc}): "
                "they take it with the next change"
            ) from None
        if before is not None and version == before + 1:  # nothing from the others was waiting
            self.seen_version = version
        await self._publish(version)

    # -- the watch ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the store's change version, then watch it (poll, and the Redis channel when configured)."""
        if self.shared is None:
            return
        with contextlib.suppress(StoreError):
            self.seen_version = await asyncio.to_thread(self.shared.change_version)
        if self._redis_url:
            import redis.asyncio as redis

            self._redis = redis.from_url(self._redis_url, socket_connect_timeout=1, socket_timeout=2)
            await self._subscribe()
        self._task = asyncio.create_task(self._watch(), name="turnout-peers")

    async def stop(self) -> None:
        """End the watch; a read of the store or a re-read under way finishes first (its thread holds a database
        connection that must be back before the store closes)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        under_way = [f for f in (self._reading, self._pending) if f is not None and not f.done()]
        if under_way:
            await asyncio.wait(under_way)
        await self._unsubscribe()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    @contextlib.asynccontextmanager
    async def quiet(self) -> AsyncIterator[None]:
        """No read of the store by the watch, nor a re-read it started, while the block runs (a restore replaces the
        database's connection pool: a connection held meanwhile would go back to the old pool, never closed)."""
        self._quiet += 1
        try:
            under_way = [f for f in (self._reading, self._pending) if f is not None and not f.done()]
            if under_way:
                await asyncio.wait(under_way)
            yield
        finally:
            self._quiet -= 1

    def close(self) -> None:
        if self.counter is not None:
            self.counter.close()

    async def _watch(self) -> None:
        assert self.shared is not None
        last_try = time.monotonic()
        while True:
            await self._wait()
            if self._redis is not None and self._subscription is None and time.monotonic() - last_try > _RESUBSCRIBE_S:
                last_try = time.monotonic()
                await self._subscribe()
            if self._quiet:
                continue
            self._reading = asyncio.ensure_future(asyncio.to_thread(self.shared.change_version))
            try:
                version = await asyncio.shield(self._reading)
            except StoreError as exc:
                if not self._store_down:
                    log.warning("cannot read the admin change version from the store (%s): retrying", exc)
                self._store_down = True
                continue
            if self._store_down:
                log.warning("the store answers again: admin changes of other replicas are followed again")
                self._store_down = False
            if version != self.seen_version:
                await self.catch_up(version)

    async def _wait(self) -> None:
        """Until a change is published on Redis, or :attr:`poll_s` has passed."""
        if self._subscription is None:
            await asyncio.sleep(self.poll_s)
            return
        import redis.exceptions

        try:
            await self._subscription.get_message(ignore_subscribe_messages=True, timeout=self.poll_s)
        except (redis.exceptions.RedisError, OSError) as exc:
            self._lost_redis(exc)
            await self._unsubscribe()
            await asyncio.sleep(self.poll_s)

    async def _subscribe(self) -> None:
        import redis.exceptions

        subscription = self._redis.pubsub()
        try:
            await subscription.subscribe(CHANNEL)
        except (redis.exceptions.RedisError, OSError) as exc:
            self._lost_redis(exc)
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await subscription.aclose()
            return
        self._subscription = subscription
        if self._redis_down:
            log.warning("Redis answers again: admin changes of other replicas are heard at once again")
            self._redis_down = False

    async def _unsubscribe(self) -> None:
        import redis.exceptions

        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await subscription.aclose()

    async def _publish(self, version: int) -> None:
        if self._redis is None:
            return
        import redis.exceptions

        try:
            await self._redis.publish(CHANNEL, str(version))
        except (redis.exceptions.RedisError, OSError) as exc:
            self._lost_redis(exc)

    def _lost_redis(self, exc: BaseException) -> None:
        if not self._redis_down:
            log.warning(
                "Redis (%s): admin changes reach the other replicas through the store's poll (within %.1f s)",
                exc,
                self.poll_s,
            )
        self._redis_down = True
