"""One prefix index for every process of `turnout serve --workers N`: what one process records in a worker's index
(:meth:`turnout.gateway.dispatch.Dispatcher` records a prompt where it sends it) is relayed through the
supervisor (:mod:`turnout.gateway.shared_limits`' channel) and recorded in the same worker's index in every
other process, a few hundred microseconds later. So a conversation whose turns reach different processes (a
client's connections are spread over them by the kernel) still goes where its beginning is held.

Each process keeps its own copy, and only what is recorded is shared: the requests in flight on each worker and
the learned speeds stay each process's own. Gateway replicas on other machines share nothing; the prefix keys are
salted per interpreter (:mod:`turnout.core.prefix`), equal only in processes forked from one supervisor.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from turnout.core.prefix import Prompt
from turnout.fleet.state import Fleet
from turnout.gateway.shared_limits import SharedLimiter

__all__ = ["SharedPrefixes"]

log = logging.getLogger("turnout.gateway")


class SharedPrefixes:
    def __init__(self, channel: SharedLimiter, fleet: Fleet) -> None:
        self.channel = channel
        self.fleet = fleet
        channel.on_relay = self._recorded_elsewhere

    def listen(self) -> None:
        """Start taking the other processes' records (on the event loop, at start)."""
        self.channel.listen()

    def recorded(self, worker: str, prompt: Prompt) -> None:
        """This process recorded ``prompt`` in ``worker``'s index: the others record it too."""
        self.channel.relay([0, "relay", worker, list(prompt.keys), prompt.size, prompt.block, prompt.session])

    def _recorded_elsewhere(self, message: list[Any]) -> None:
        try:
            _, _, worker, keys, size, block, session = message
            state = self.fleet.workers.get(worker)
            if state is not None:
                state.prefix.record(Prompt(tuple(keys), size, block, session), time.monotonic())
        except (TypeError, ValueError) as exc:  # a frame of another version: ignore it, say so once per kind
            log.debug("ignoring a relayed prefix record: %s", exc)
