"""Processes a test session started that outlived it, found by a mark in their environment.

The session puts ``SESSION_MARK=<its own id>`` in ``os.environ`` when it starts; every process a test starts
inherits it (and their children, daemonised or reparented to init), unless the test hands it an environment of
its own. When the session ends, after every fixture is torn down, a live process that still carries this
session's mark was started by a test and never stopped: ``tests/conftest.py`` names each and fails the run
(the per-test check there sees only the test's own direct children)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

__all__ = ["SESSION_MARK", "describe", "mark_session", "marked_processes", "wait_for_none"]

SESSION_MARK = "TESTS_SESSION_MARK"  # not TURNOUT_*: some tests pass on the environment without those


def mark_session() -> str:
    """Mark this process's environment (so everything it starts) with a new session id; the id."""
    value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[SESSION_MARK] = value
    return value


def marked_processes(value: str) -> list[int]:
    """Live processes (zombies aside) other than this one whose environment carries ``SESSION_MARK=value``."""
    needle = f"{SESSION_MARK}={value}".encode()
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile, or not readable
            continue
        if state != "Z":
            found.append(int(entry.name))
    return sorted(found)


def wait_for_none(value: str, limit_s: float = 5.0) -> list[int]:
    """Poll (a process ending is no event here) until no marked process is left or time is up; what is left."""
    deadline = time.monotonic() + limit_s
    left = marked_processes(value)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(value)
    return left


def describe(pid: int) -> str:
    """``pid: command line (parent ppid)``, for the report."""
    try:
        cmdline = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")).strip()
        ppid = (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split())[1]
    except (OSError, IndexError):
        return f"{pid}: (gone)"
    return f"{pid}: {cmdline[:200]} (parent {ppid})"
