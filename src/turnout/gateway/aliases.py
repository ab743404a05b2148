"""The model aliases a gateway process resolves: the config's, with the store's runtime ones over them.

:attr:`Aliases.table` is an immutable :class:`~turnout.core.aliases.AliasTable`, replaced whole on each reload,
so a request reads it without a lock or an await. It is reloaded from the store

- right after this process changes an alias through the admin API (:meth:`Aliases.reload`),
- when another process of `turnout serve --workers N` did (the peers' catch-up, ``turnout.wiring``),
- every :data:`SYNC_S` seconds, for replicas on other machines and for `turnout alias` run while no gateway
  answered (it writes the store directly).

A store that cannot be read keeps the last table (the config's alone at start) and says so in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from turnout.core.aliases import AliasTable
from turnout.store.aliases import AliasRecord, AliasStore
from turnout.store.db import StoreError

__all__ = ["SYNC_S", "Aliases"]

log = logging.getLogger("turnout.gateway")

SYNC_S = 5.0  # how often aliases set elsewhere (another replica, the CLI on the store) are picked up


class Aliases:
    def __init__(self, config: Mapping[str, str], store: AliasStore) -> None:
        self.config = dict(config)
        self.store = store
        self.records: list[AliasRecord] = []  # the runtime aliases as last read
        self.table = AliasTable.merge(self.config, {})
        self._problems: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def reload(self) -> None:
        """Re-read the runtime aliases (the last table stays when the store cannot be read)."""
        try:
            records = await asyncio.to_thread(self.store.all)
        except StoreError as exc:
            log.warning("cannot read the model aliases (the ones read before stay in force): %s", exc)
            return
        self.apply(records)

    def apply(self, records: list[AliasRecord]) -> None:
        """Put ``records`` (every runtime alias) in force over the config's."""
        self.records = records
        self.table = AliasTable.merge(self.config, {r.name: r.model for r in records})
        problems = self.table.problems()
        if problems != self._problems:  # said once per change, not every few seconds
            for problem in problems:
                log.warning("model aliases: %s (resolved one step; change one of them)", problem)
            self._problems = problems

    async def start(self) -> None:
        await self.reload()
        self._task = asyncio.create_task(self._loop(), name="turnout-aliases")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            try:
                await self.reload()
            except Exception:  # one bad round must not end the refresh
                log.exception("model alias refresh failed")
