"""The serve loop (:mod:`turnout.gateway.server`): which event loop it runs on."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys

import pytest
from aiohttp import web

from turnout.gateway import server


def _loop_class_seen_by_the_app() -> type[asyncio.AbstractEventLoop]:
    """Run a bare app through ``server.run`` on a free loopback port; SIGTERM it as soon as it is ready."""
    seen: list[type[asyncio.AbstractEventLoop]] = []

    async def startup(_: web.Application) -> None:
        seen.append(type(asyncio.get_running_loop()))

    app = web.Application()
    app.on_startup.append(startup)
    drained = server.run(
        app,
        server.bind("127.0.0.1", 0),
        drain_timeout_s=1,
        access_log=None,
        on_ready=lambda: os.kill(os.getpid(), signal.SIGTERM),
        on_stopping=lambda _: None,
    )
    assert drained.in_flight == 0
    return seen[0]


def test_serve_runs_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")  # a dependency on CPython outside Windows
    assert server.loop_factory() is uvloop.new_event_loop
    assert issubclass(_loop_class_seen_by_the_app(), uvloop.Loop)


def test_serve_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert server.loop_factory() is asyncio.new_event_loop
    assert _loop_class_seen_by_the_app().__module__.startswith("asyncio")


def test_startup_objects_are_frozen_out_of_the_collector() -> None:
    """What start-up allocated lives as long as the process: frozen (``gc.freeze``) before requests are
    served, so full collections no longer walk it while requests wait (tail latency)."""
    frozen: list[int] = []

    def ready() -> None:
        frozen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGTERM)

    gc.unfreeze()
    try:
        server.run(
            web.Application(),
            server.bind("127.0.0.1", 0),
            drain_timeout_s=1,
            access_log=None,
            on_ready=ready,
            on_stopping=lambda _: None,
        )
    finally:
        gc.unfreeze()  # leave the test process as it was
    assert frozen and frozen[0] > 0
