"""Running the gateway app: bind first, serve, drain on SIGINT / SIGTERM.

`turnout serve` calls :func:`bind` before it builds anything, so a busy port is one line and nothing in the
data dir has been touched; :func:`run` starts the app on those sockets, calls ``on_ready`` once the app's
start-up has finished and the sockets accept (that is when "serving on" is printed), and on the first
SIGINT or SIGTERM stops accepting, lets the requests in flight finish for up to ``drain_timeout_s``,
cancels the rest while their connections are open (the proxy ends a cancelled stream with an error frame),
runs the app's cleanup (usage flushed, store closed) and returns what happened. A second
signal while draining ends the process at once.

The event loop is uvloop's where it is installed (a dependency on CPython outside Windows: it takes about a
fifth off the gateway's CPU per request, bench/README.md), asyncio's own otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from turnout.gateway.frame import Handler

__all__ = ["BindError", "Drained", "bind", "loop_factory", "run", "start_runner"]

_CANCEL_WAIT_S = 5.0  # for cancelled requests to write their last frame and finish


class BindError(Exception):
    """The address cannot be listened on; the message says why and what to change."""


@dataclass
class Drained:
    """What stopping did: requests in flight when the signal came, and how many of them were cut off."""

    in_flight: int = 0
    closed: int = 0


_BIND_ADVICE = {
    errno.EADDRINUSE: "another process is listening there: stop it, or pick another port with --port or listen.port",
    errno.EACCES: "ports below 1024 need privileges: pick a port from 1024 with --port or listen.port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: fix --host or listen.host",
}


def bind(host: str, port: int, *, reuse_port: bool = False) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to (``localhost``: 127.0.0.1 and ::1);
    ``reuse_port``: with ``SO_REUSEPORT``, so that the processes of `turnout serve --workers N` share the port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BindError(
            f"cannot listen on {host}:{port}: unknown host ({exc.strerror}): fix --host or listen.host"
        ) from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, _, _, _, address in infos:
            if (family, address[0]) in seen:
                continue
            seen.add((family, address[0]))
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, not one in use
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(511)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        advice = _BIND_ADVICE.get(exc.errno or 0, "pick another address with --host / --port")
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {advice}") from None
    return sockets


class _InFlight:
    """The requests being handled (their tasks), and how many were cancelled while stopping."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.idle = asyncio.Event()
        self.idle.set()
        self.stopping = False
        self.closed = 0

    @property
    def count(self) -> int:
        return len(self.tasks)

    def counting(self, handler: Handler) -> Handler:
        """``handler`` with its requests counted: the outermost layer, so whatever the app does counts."""

        async def counted(request: web.BaseRequest) -> web.StreamResponse:
            task = asyncio.current_task()
            assert task is not None
            self.tasks.add(task)
            self.idle.clear()
            try:
                return await handler(request)
            except asyncio.CancelledError:
                if self.stopping:
                    self.closed += 1
                raise
            finally:
                self.tasks.discard(task)
                if not self.tasks:
                    self.idle.set()

        return counted

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the requests to finish, then cancel the rest while their connections are
        still open, so that a stream can end with its error frame (the proxy writes it on cancellation)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), timeout_s)
        left = list(self.tasks)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=_CANCEL_WAIT_S)


async def start_runner(
    app: web.Application, *, wrap: Callable[[Handler], Handler] | None = None, **options: Any
) -> web.AppRunner:
    """``app`` set up (its start-up run) for serving, with the gateway's own request handler
    (:func:`turnout.gateway.frame.request_handler`), ``wrap``-ped if given; ``options`` go to ``web.AppRunner``.
    Add sites to the runner to serve; the tests serve the gateway through this too."""
    from turnout.gateway.frame import request_handler  # here: `turnout serve`'s supervisor only binds

    runner = web.AppRunner(app, **options)
    await runner.setup()
    server = runner.server
    assert server is not None
    handler = request_handler(app)
    server.request_handler = handler if wrap is None else wrap(handler)  # read by each connection as it opens
    return runner


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop when it can be imported, else asyncio's default one."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(
    app: web.Application,
    sockets: list[socket.socket],
    *,
    drain_timeout_s: float,
    access_log: logging.Logger | None,
    on_ready: Callable[[], None],
    on_stopping: Callable[[int], None],
) -> Drained:
    """Serve ``app`` on ``sockets`` until SIGINT or SIGTERM, then drain (see the module docstring)."""
    in_flight = _InFlight()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(_serve(app, sockets, in_flight, drain_timeout_s, access_log, on_ready, on_stopping))


async def _serve(
    app: web.Application,
    sockets: list[socket.socket],
    in_flight: _InFlight,
    drain_timeout_s: float,
    access_log: logging.Logger | None,
    on_ready: Callable[[], None],
    on_stopping: Callable[[int], None],
) -> Drained:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # The app's start-up (store, pollers) runs here; sockets queue connections meanwhile. The drain is done by
    # in_flight.drain: the runner's own shutdown only tidies up.
    runner = await start_runner(
        app,
        wrap=in_flight.counting,
        handle_signals=False,
        access_log=access_log,
        handler_cancellation=True,
        shutdown_timeout=_CANCEL_WAIT_S,
    )
    # Everything allocated so far (modules, the app, the store's engine) lives as long as the process: keep it
    # out of the garbage collector's full passes, which otherwise walk it all while requests wait.
    gc.freeze()
    drained = Drained()
    try:
        for sock in sockets:
            await web.SockSite(runner, sock).start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        on_ready()
        await stop.wait()
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal: the default action, at once
            loop.remove_signal_handler(sig)
        for site in list(runner.sites):  # refuse new connections before saying so
            await site.stop()
        drained.in_flight = in_flight.count
        in_flight.stopping = True
        on_stopping(in_flight.count)
        await in_flight.drain(drain_timeout_s)
    finally:
        await runner.cleanup()  # close the idle connections, then the app's cleanup (usage flushed, store closed)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    drained.closed = in_flight.closed
    return drained
