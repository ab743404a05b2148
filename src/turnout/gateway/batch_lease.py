"""One runner at a time per batch: a lease in the SQL store, or in Redis when ``storage.redis_url`` is set.

A runner (one gateway process: host, pid and a random part) takes a batch's lease before it sends any of its lines,
renews it every third of ``batches.lease_s`` while it runs, and gives it back when it stops; a runner that dies
stops renewing, and once the lease lapses another gateway (or this one restarted) takes the batch over and resumes
it. A runner that fails to renew stops taking lines at once. Two runners overlapping for a moment (a renewal that
came too late) cannot answer a line twice: the store keeps one answer per line (:mod:`turnout.store.batches`).

The SQL lease is the batch row's ``runner`` and ``lease_until`` (each replica's clock: keep them synchronised, as
NTP does); the Redis lease is a key with a time to live (``SET NX PX``, renewed and released only by its holder, in
one script each), timed by the Redis server alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Protocol

from turnout.store.batches import BatchStore
from turnout.store.db import StoreError

__all__ = ["Leases", "RedisLeases", "SqlLeases", "runner_id"]

log = logging.getLogger("turnout.batches")

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def runner_id() -> str:
    """This process's name as a batch runner: host, pid and a random part (a restarted process is a new runner)."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(4)}"


class Leases(Protocol):
    runner: str
    in_sql: bool  # the store's runnable() can leave out batches whose SQL lease another runner holds

    async def claim(self, batch_id: str) -> bool: ...
    async def renew(self, batch_id: str) -> bool: ...
    async def release(self, batch_id: str) -> None: ...
    async def close(self) -> None: ...


class SqlLeases:
    in_sql = True

    def __init__(self, store: BatchStore, lease_s: float, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.lease_s = lease_s
        self.clock = clock
        self.runner = runner_id()

    async def claim(self, batch_id: str) -> bool:
        try:
            return await asyncio.to_thread(self.store.claim, batch_id, self.runner, self.clock(), self.lease_s)
        except StoreError as exc:
            log.warning("cannot take the lease on batch %s: %s", batch_id, exc)
            return False

    async def renew(self, batch_id: str) -> bool:
        try:
            return await asyncio.to_thread(self.store.renew, batch_id, self.runner, self.clock(), self.lease_s)
        except StoreError as exc:
            log.warning("cannot renew the lease on batch %s (its lines stop here): %s", batch_id, exc)
            return False

    async def release(self, batch_id: str) -> None:
        try:
            await asyncio.to_thread(self.store.release, batch_id, self.runner)
        except StoreError as exc:  # it lapses by itself
            log.warning("cannot give back the lease on batch %s (it lapses in %g s): %s", batch_id, self.lease_s, exc)

    async def close(self) -> None:
        pass


class RedisLeases:
    in_sql = False

    def __init__(self, url: str, lease_s: float, *, prefix: str = "turnout") -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self.lease_ms = max(1, int(lease_s * 1000))
        self.prefix = prefix
        self.runner = runner_id()

    def _key(self, batch_id: str) -> str:
        return f"{self.prefix}:batch-lease:{batch_id}"

    async def claim(self, batch_id: str) -> bool:
        import redis.exceptions

        try:
            return bool(await self._redis.set(self._key(batch_id), self.runner, nx=True, px=self.lease_ms))
        except redis.exceptions.RedisError as exc:
            log.warning("cannot take the lease on batch %s in Redis: %s", batch_id, exc)
            return False

    async def renew(self, batch_id: str) -> bool:
        import redis.exceptions

        try:
            return bool(await self._renew(keys=[self._key(batch_id)], args=[self.runner, self.lease_ms]))
        except redis.exceptions.RedisError as exc:
            log.warning("cannot renew the lease on batch %s in Redis (its lines stop here): %s", batch_id, exc)
            return False

    async def release(self, batch_id: str) -> None:
        import redis.exceptions

        try:
            await self._release(keys=[self._key(batch_id)], args=[self.runner])
        except redis.exceptions.RedisError as exc:
            log.warning("cannot give back the lease on batch %s in Redis (it lapses by itself): %s", batch_id, exc)

    async def close(self) -> None:
        await self._redis.aclose()
