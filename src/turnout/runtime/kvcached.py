"""kvcached: whether an engine's interpreter has it, and its shared-memory segments (read KV usage, apply a
capacity limit).

Each engine's segment is ``/dev/shm/<ipc_name>`` (and ``<ipc_name>_g<N>`` per group): three little-endian
int64 values ``total, used, prealloc``. A limit rewrites ``total`` under an exclusive ``flock`` (as
``kvctl limit`` does), then the segment is read back to verify.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KvUsage", "apply_limit", "importable", "read_usage"]

_FMT = "<qqq"
_SIZE = struct.calcsize(_FMT)


@dataclass(frozen=True, slots=True)
class KvUsage:
    total: int
    used: int
    prealloc: int


def _segments(ipc: str, shm: Path) -> list[Path]:
    base = shm / ipc
    groups = sorted(shm.glob(f"{ipc}_g*"), key=lambda p: p.name)
    return ([base] if base.exists() else []) + [g for g in groups if g.name[len(ipc) + 2 :].isdigit()]


def read_usage(ipc: str, shm: Path = Path("/dev/shm")) -> KvUsage | None:
    """Summed over the segment and its groups; None when no segment exists (kvcached not active)."""
    total = used = prealloc = 0
    found = False
    for path in _segments(ipc, shm):
        try:
            data = path.read_bytes()[:_SIZE]
        except OSError:
            continue
        if len(data) < _SIZE:
            continue
        t, u, p = struct.unpack(_FMT, data)
        total, used, prealloc, found = total + t, used + u, prealloc + p, True
    return KvUsage(total, used, prealloc) if found else None


def apply_limit(ipc: str, limit_bytes: int, shm: Path = Path("/dev/shm")) -> KvUsage:
    """Set the total capacity (spread evenly over groups); raises OSError/ValueError when it does not stick."""
    paths = _segments(ipc, shm)
    if not paths:
        raise FileNotFoundError(f"no kvcached segment /dev/shm/{ipc}: is the engine running with kvcached?")
    share, rest = divmod(limit_bytes, len(paths))
    for index, path in enumerate(paths):
        value = share + (rest if index == 0 else 0)
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, struct.pack("<q", value), 0)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    usage = read_usage(ipc, shm)
    if usage is None or usage.total != limit_bytes:
        raise ValueError(f"kvcached limit did not stick: wrote {limit_bytes}, read {usage}")
    return usage


# Asked of the engine's own interpreter: kvcached is what its .pth file (kvcached_autopatch.pth) imports at start.
_PROBE = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('kvcached') else 3)"


def importable(python: str, timeout_s: float = 60.0) -> bool:
    """Whether the interpreter ``python`` (an engine's, from ``--engine-python``, or the agent's own) can import
    kvcached, as an engine started by the agent would: that interpreter is asked, with the agent's environment
    (its ``PYTHONPATH`` included) but without ``KVCACHED_AUTOPATCH``, so that the question does not load
    kvcached's patches. An interpreter that cannot be run, or does not answer in time, cannot."""
    env = {k: v for k, v in os.environ.items() if k != "KVCACHED_AUTOPATCH"}
    try:
        done = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
