"""`turnout serve --workers N`: N gateway processes on one port, started and watched by a supervisor.

Sockets: the supervisor binds one listening socket per process with ``SO_REUSEPORT`` (after a plain bind
has shown the port is free, so a busy port is one line, and a second gateway cannot join the group), and
each process serves on its own. The kernel spreads connections over the sockets by their addresses, where
one shared socket would let whichever process wakes first take a burst of connections (asyncio accepts up
to a backlog's worth at once). The supervisor keeps every socket open, so connections that reach a crashed
process's socket wait in its backlog until the replacement accepts them.

Processes are forked after the configuration, store and admin token have been checked once in the
supervisor, so a bad config or store is one line, exit 2, before any process serves. A process that ends
unexpectedly is started again after 0.5 s, doubling per crash in a row up to 30 s (a process that served for
a minute starts the count over). SIGINT or SIGTERM: the supervisor closes its copies of the sockets and
passes the signal on once; each process drains as `turnout serve` alone does; a second signal is passed on
too and ends them at once.

What must be exact across the processes is counted where they all see it: rate windows and token budgets, the
requests in flight (every concurrency cap, exact and work-conserving), the wait queue and the workers' prefix
indexes by the supervisor (``turnout.gateway.shared_limits``, ``turnout.gateway.supervised``) or Redis; admin
changes through a shared change counter (``turnout.gateway.peers``). The
in-process claims controller (``pools.agents``) cannot run N times and is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from turnout.config import Settings
from turnout.core.runtime import backoff_s
from turnout.gateway.server import BindError, Drained, bind
from turnout.gateway.shared_limits import LimitKeeper

__all__ = ["Supervisor", "bind_group", "cpu_count", "processes_problem"]

log = logging.getLogger("turnout.serve")

RESTART_BASE_S = 0.5
RESTART_CAP_S = 30.0
STEADY_S = 60.0  # a process that served this long starts its crash count over
_POLL_S = 0.1


def cpu_count() -> int:
    """The cores this process may run on (``--workers auto``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def processes_problem(settings: Settings, processes: int) -> str | None:
    """Why this config cannot run as ``processes`` processes (one line saying what to change), or None."""
    if processes <= 1:
        return None
    hint = f"--workers {processes}"
    if settings.pools is not None and settings.pools.agents:
        return (
            f"pools.agents runs the claims controller inside the gateway, which cannot run {processes} times: "
            "serve with --workers 1, or run the pools with `turnout controller` and drop pools.agents here"
        )
    if settings.pools is not None and not settings.storage.redis_url:
        return (
            f"pools.kubernetes with {hint} needs storage.redis_url, so that a sleeping model is woken once, not "
            "once per process: set storage.redis_url or serve with --workers 1"
        )
    return None


def bind_group(host: str, port: int, processes: int) -> list[list[socket.socket]]:
    """One set of listening sockets per process, all on ``host:port`` with ``SO_REUSEPORT``. Raises BindError."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise BindError("--workers above 1 needs SO_REUSEPORT, which this system lacks: serve with --workers 1")
    for sock in bind(host, port):  # a plain bind first: refused when anything listens there, a gateway too
        sock.close()
    groups: list[list[socket.socket]] = []
    try:
        for _ in range(processes):
            groups.append(bind(host, port, reuse_port=True))
    except BindError:
        for group in groups:
            for sock in group:
                sock.close()
        raise
    return groups


@dataclass
class _Child:
    index: int
    pid: int
    started: float
    crashes: int  # unexpected ends in a row before this start
    ready: bool = False


@dataclass
class Supervisor:
    """Forks ``processes`` children that each run ``serve(index, report)`` and restarts the ones that end
    unexpectedly; ``report(line)`` tells the supervisor "ready" or "done <in flight> <closed>"."""

    processes: int
    groups: list[list[socket.socket]]
    serve: Callable[[int, Callable[[str], None], socket.socket | None], None]
    on_ready: Callable[[], None]
    on_stopping: Callable[[], None]
    on_restart: Callable[[int, int, str, float], None]  # index, pid, how it ended, delay
    keeper: LimitKeeper | None = None  # every process's limits and occupancy (a socket pair each)
    children: dict[int, _Child] = field(default_factory=dict)
    drained: Drained = field(default_factory=Drained)
    _signals: list[int] = field(default_factory=list)
    _restarts: list[tuple[float, int, int]] = field(default_factory=list)  # (when, index, crashes)

    def run(self) -> int:
        """Serve until stopped; the exit code: 0 after a stop, else the code a child failed to start with."""
        self._report_r, self._report_w = os.pipe()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: self._signals.append(signum))
        for index in range(self.processes):
            self._spawn(index, 0)
        serving = stopping = False
        buffer = b""
        due = 0.0  # the next round of the rest (reports, signals, ended processes, restarts)
        try:
            while self.children or (self._restarts and not stopping):
                limits = () if self.keeper is None else self.keeper.fds
                readable, _, _ = select.select([self._report_r, *limits], [], [], _POLL_S)
                for fd in readable:
                    if fd != self._report_r:
                        assert self.keeper is not None
                        self.keeper.serve(fd)  # a process asks about its limits: answered at once
                now = time.monotonic()
                if self._report_r not in readable and not self._signals and now < due:
                    continue  # woken for limits only: the rest waits for its round (up to _POLL_S)
                due = now + _POLL_S
                if self._report_r in readable:
                    buffer += os.read(self._report_r, 65536)
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        self._on_report(line.decode())
                started = len(self.children) == self.processes and all(c.ready for c in self.children.values())
                if started and not serving:
                    serving = True
                    self.on_ready()
                while self._signals:
                    signum = self._signals.pop(0)
                    if not stopping:
                        stopping = True
                        self._restarts.clear()
                        self._close_sockets()  # nothing new reaches a process that is draining
                        self.on_stopping()
                    for child in self.children.values():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(child.pid, signum)
                failed = self._reap(stopping, serving)
                if failed is not None:
                    self._stop_all()
                    return failed
                now = time.monotonic()
                for restart in [r for r in self._restarts if r[0] <= now]:
                    self._restarts.remove(restart)
                    self._spawn(restart[1], restart[2])
        finally:
            self._close_sockets()
            os.close(self._report_r)
            os.close(self._report_w)
            if self.keeper is not None:
                self.keeper.close()
        return 0

    def _on_report(self, line: str) -> None:
        pid_text, _, what = line.partition(" ")
        child = next((c for c in self.children.values() if str(c.pid) == pid_text), None)
        if what == "ready" and child is not None:
            child.ready = True
        elif what.startswith("done "):
            in_flight, closed = (int(n) for n in what.split()[1:3])
            self.drained.in_flight += in_flight
            self.drained.closed += closed

    def _reap(self, stopping: bool, serving: bool) -> int | None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            child = self.children.pop(pid, None)
            if child is None or stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            if not serving and not child.ready:  # it never served: starting it again would fail again
                return 2 if code == 2 else 1
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            crashes = 1 if time.monotonic() - child.started >= STEADY_S else child.crashes + 1
            delay = backoff_s(crashes, RESTART_BASE_S, RESTART_CAP_S)
            self.on_restart(child.index, pid, how, delay)
            self._restarts.append((time.monotonic() + delay, child.index, crashes))
        return None

    def _spawn(self, index: int, crashes: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        limits = None if self.keeper is None else self.keeper.connect()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                self._become_child(index)
                report_w = self._report_w

                def report(line: str) -> None:
                    os.write(report_w, f"{os.getpid()} {line}\n".encode())

                self.serve(index, report, limits)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        if limits is not None:
            limits.close()  # the child's end
        self.children[pid] = _Child(index, pid, time.monotonic(), crashes)

    def _become_child(self, index: int) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the supervisor, which passes it on once
        _die_with_parent()
        os.close(self._report_r)
        if self.keeper is not None:
            self.keeper.close()  # the supervisor's ends
        for i, group in enumerate(self.groups):
            if i != index:
                for sock in group:
                    sock.close()

    def _close_sockets(self) -> None:
        for group in self.groups:
            for sock in group:
                with contextlib.suppress(OSError):
                    sock.close()

    def _stop_all(self) -> None:
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.children.clear()


def _die_with_parent() -> None:
    """Ask Linux to send SIGTERM to this process when the supervisor dies (a SIGKILL leaves no one to pass the
    signal on); elsewhere, nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
