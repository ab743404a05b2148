"""Whose port is it: an engine counts as answering only where it listens itself.

An agent picks a free port of its range, then starts the engine, which binds it a moment later (a second or more:
the interpreter starts first). Another process can bind the port in between: a second agent on the same host (two
``turnout serve`` with the demo model pick from the same range), or any server. The engine then fails to bind and
exits, but until it does, a health check on the port is answered by the other process, and an engine taken as
ready there would send the gateway's requests to someone else's server. So a health check counts only when the
engine's own process (or one it started: vLLM's API server processes) holds a listening socket on the port:
:func:`listens_on`. The socket table is read through psutil (``/proc`` on Linux).
"""

from __future__ import annotations

import socket

import psutil

__all__ = ["listens_on", "port_free"]


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``; None when this system will not
    say (another user's process, no socket table): the caller then judges by the health check alone."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return None
    for process in processes:
        try:
            sockets = process.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue  # a child that ended meanwhile
        except psutil.Error:
            return None
        if any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr.port == port for s in sockets):
            return True
    return False


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now: as servers do, with ``SO_REUSEADDR`` (the engine's own
    connections still in TIME_WAIT after it stopped do not hold its port; another listener does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
