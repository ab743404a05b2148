"""A real gateway (and its workers) on an event loop in a background thread, for Hypothesis tests that
send many requests from plain synchronous code. Everything listens on 127.0.0.1 and stops with the block."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from turnout.config import load_settings
from turnout.gateway.server import start_runner
from turnout.wiring import create_app

__all__ = ["Client", "LoopThread", "Response", "Started", "threaded_gateway"]

T = TypeVar("T")
Response = tuple[int, str, bytes]
Started = tuple[list[dict[str, Any]], Callable[[], Awaitable[None]]]


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="gateway-loop")
        self.thread.start()

    def run(self, factory: Callable[[], Awaitable[T]], timeout_s: float = 30) -> T:
        async def wrapped() -> T:
            return await factory()

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout_s)

    def stop(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(drain)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Client:
    """Synchronous HTTP/1.1 to the gateway (one request per connection: nothing carries over)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def post(self, path: str, body: bytes, timeout_s: float = 20) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()


@contextmanager
def threaded_gateway(
    tmp: Path, start_workers: Callable[[], Awaitable[Started]], **sections: Any
) -> Iterator[tuple[LoopThread, Client]]:
    """``start_workers`` runs on the gateway's loop and returns the config's worker entries and a coroutine
    function that stops them."""
    loop = LoopThread()
    runner: web.AppRunner | None = None
    stop_workers: Callable[[], Awaitable[None]] | None = None
    try:
        workers, stop_workers = loop.run(start_workers)
        config = {
            "storage": {"data_dir": str(tmp / "data")},
            "health": {"interval_s": 3600, "timeout_s": 2, "failures_to_down": 100},
            "auth": {"open": True},
            "workers": workers,
            **sections,
        }
        path = tmp / "config.json"
        path.write_text(json.dumps(config))
        settings = load_settings(path, env={})

        async def serve() -> tuple[web.AppRunner, int]:
            app = create_app(settings, admin_token="fuzz-admin-token")
            r = await start_runner(app, handler_cancellation=True)
            site = web.TCPSite(r, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.Server)
            return r, int(server.sockets[0].getsockname()[1])

        runner, port = loop.run(serve)
        yield loop, Client(port)
    finally:
        if runner is not None:
            loop.run(runner.cleanup)
        if stop_workers is not None:
            loop.run(stop_workers)
        loop.stop()
