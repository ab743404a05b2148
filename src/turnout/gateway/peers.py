"""The other gateway processes on this data dir (`turnout serve --workers N`, replicas sharing the dir): their
admin changes picked up, ours announced.

A process that changes placement, keys, endpoints or model aliases through the admin API announces it on the
shared :class:`~turnout.state.changes.ChangeCounter` before answering; every process checks the counter at the
start of each request and, when it moved, re-reads what it keeps in memory once (concurrent requests wait for
that one re-read) before going on. So a key revoked or an override written through one process is in force in all
of them for the next request. Used by ``turnout.wiring``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from turnout.state.changes import ChangeCounter

__all__ = ["Peers"]

log = logging.getLogger("turnout.gateway")


class Peers:
    def __init__(self, counter: ChangeCounter, reload: Callable[[], Awaitable[None]]) -> None:
        self.counter = counter
        self._reload = reload
        self._pending: asyncio.Future[None] | None = None

    def moved(self) -> bool:
        return self.counter.moved()

    async def catch_up(self) -> None:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._run(self.counter.value()))
        await asyncio.shield(self._pending)

    async def _run(self, value: int) -> None:
        try:
            await self._reload()
        except Exception:  # keep serving with what this process has; the next change tries again
            log.exception("could not re-read the state another gateway process changed")
        finally:
            self.counter.caught_up(value)
            self._pending = None

    def announce(self) -> None:
        self.counter.bump()

    def close(self) -> None:
        self.counter.close()
