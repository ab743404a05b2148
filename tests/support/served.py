"""A long-running command under test, its output read line by line as it comes (tests/test_cli_serve.py,
tests/test_scripts_serve.py)."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

__all__ = ["Served"]


class Served:
    """A serving process (`turnout serve`, ./scripts/serve) whose output is read line by line (stdout and stderr
    together) as it comes, so a test can wait for a line with a deadline."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, limit_s: float = 30) -> str:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"turnout exited before printing {text!r}: {self.lines}")
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} within {limit_s} s: {self.lines}")

    def stop(self, sig: int = signal.SIGINT, limit_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(limit_s)

    def wait(self, limit_s: float = 30) -> int:
        """The exit code, once the process has ended by itself; every line it printed is in ``lines``."""
        code = self.proc.wait(limit_s)
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
