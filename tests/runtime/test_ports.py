"""Whose port is it (turnout.runtime.ports): read from the real socket table, for this process and its children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from turnout.runtime.ports import listens_on, port_free


def test_a_listener_is_found_in_the_process_or_its_children_and_nowhere_else() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert listens_on(os.getpid(), port) is True
        assert not port_free("127.0.0.1", port)
        # a child that does not listen does not own it; a parent whose child listens does
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert listens_on(idle.pid, port) is False
        finally:
            idle.kill()
            idle.wait(timeout=10)
    code = (
        "import socket, time\n"
        "s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True); time.sleep(30)\n"
    )
    parent = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "$0"; sleep 30', code],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, ended whole below
    )
    try:
        assert parent.stdout is not None
        child_port = int(parent.stdout.readline())
        assert listens_on(parent.pid, child_port) is True  # the engine's interpreter under its wrapper
        assert listens_on(parent.pid, child_port + 1 if child_port < 65535 else child_port - 1) is False
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_process_that_is_gone_listens_on_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert listens_on(int(done.stdout), 1) is False
