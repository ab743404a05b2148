"""The demo pool's runtime agent, run by the gateway itself (:mod:`turnout.core.demo` says what the demo is).

``turnout serve`` with the demo model serves a runtime agent (the same application ``turnout agent`` runs) on a
loopback port of its own, in the gateway's event loop: the local controller drives it over HTTP as it drives
any pool pod, and the engine it starts is a child of the gateway, in its own session. When the gateway stops,
so does the engine (an agent on a pool pod leaves its engines running for the next agent; the demo's has no
next agent to hand them to). After a gateway that was killed outright, the next start re-adopts the engine it
left behind, from ``<data_dir>/demo/engines.json``.

What of the demo is installed here, and where its model file is: :mod:`turnout.runtime.demo_install`.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from turnout.runtime.agent import SUPERVISOR, create_agent_app

__all__ = ["DemoAgent"]

log = logging.getLogger("turnout.demo")

ENGINE_PORTS = (20000, 20999)  # the agent's default range (AIBrix's); one that is taken is skipped


class DemoAgent:
    """A runtime agent on a loopback port of its own, served by the caller's event loop (``start``/``stop``).
    The port is bound at construction, so that the pool's ``agent_url`` is known before anything starts."""

    def __init__(self, pool: str, data_dir: Path) -> None:
        self.pool = pool
        self.dir = data_dir / "demo"
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.app = create_agent_app(
            registry_path=self.dir / "engines.json", log_dir=self.dir / "logs", port_range=ENGINE_PORTS
        )
        self._runner: web.AppRunner | None = None
        self.on_ready: Callable[[], None] | None = None  # called once, when the demo model first answers
        self.ready = False

    def announce_ready(self) -> None:
        if not self.ready:
            self.ready = True
            if self.on_ready is not None:
                self.on_ready()

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()  # re-adopts an engine a killed gateway left running
        await web.SockSite(self._runner, self._sock).start()

    async def stop(self) -> None:
        """Stop the engine (its process group), then the agent."""
        if self._runner is None:
            self._sock.close()
            return
        await self.app[SUPERVISOR].stop_all()
        await self._runner.cleanup()
        self._runner = None
        self._sock.close()
