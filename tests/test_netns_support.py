"""tests/support/netns.py: what a test starts in a namespace of its own ends with it.

The stand-in for "something answers at Ollama's address" (WITH_LISTENER) is a file server beside the command;
it must not outlive the command, whether the command ends by itself or the test kills it (a test that kills its
gateway left two such listeners running after the whole suite, each holding its network namespace)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.netns import WITH_LISTENER, enter, isolated, require


def _net_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _in_namespace(namespace: str, but: int) -> list[int]:
    """Live processes in ``namespace`` other than ``but``."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if pid != but and _net_namespace(pid) == namespace and _alive(pid)]


@pytest.mark.parametrize("ending", ["killed", "exits"])
def test_the_listener_ends_with_the_command_beside_it(ending: str) -> None:
    require()
    proc = subprocess.Popen(
        isolated(["bash", "-c", "read -r line"], prelude=WITH_LISTENER),
        env={**os.environ, "LISTEN_PORT": "11434"},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    namespace = None
    try:
        deadline = time.monotonic() + 30
        while True:  # the prelude waits for the listener before it execs the command: wait for it to answer
            answered = subprocess.run(
                enter(proc.pid, ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/11434"]), capture_output=True, timeout=10
            )
            if answered.returncode == 0:
                break
            assert time.monotonic() < deadline and proc.poll() is None, "the listener never answered"
            time.sleep(0.05)
        namespace = _net_namespace(proc.pid)
        assert namespace is not None and namespace != _net_namespace(os.getpid())
        # the prelude's own wait, ending (more than one), or a /proc scan that missed the listener mid-read (none)
        while len(listeners := _in_namespace(namespace, but=proc.pid)) != 1:
            assert time.monotonic() < deadline, [Path(f"/proc/{p}/cmdline").read_bytes() for p in listeners]
            time.sleep(0.05)
        assert len(listeners) == 1, listeners
        cmdline = Path(f"/proc/{listeners[0]}/cmdline").read_bytes().split(b"\0")
        assert b"http.server" in cmdline, cmdline
    finally:
        if ending == "killed":
            proc.kill()
        else:
            assert proc.stdin is not None
            proc.stdin.close()  # `read` ends: the command exits by itself
        proc.wait(10)
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
    assert namespace is not None
    deadline = time.monotonic() + 10
    while (left := _in_namespace(namespace, but=proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:  # this test stops them either way; that they were left is the failure
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running in the test's namespace after its command ended: {left}"


def test_a_session_fails_when_a_process_a_test_started_outlives_it(tmp_path: Path) -> None:
    """The suite's own guard (tests/support/leftovers.py, tests/conftest.py): a test whose process outlives it,
    reparented so that the per-test check of direct children cannot see it, fails the session, which names
    and stops it."""
    leaky = tmp_path / "test_leaky.py"
    leaky.write_text(
        "import subprocess\n\n\n"
        "def test_leaves_one_behind() -> None:\n"
        "    subprocess.run(['bash', '-c', '(exec sleep 97 &)'], check=True)  # reparented at once\n"
    )
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-c",
            str(root / "pyproject.toml"),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            str(leaky),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout[-3000:]
    assert "1 passed" in run.stdout and "left-over processes" in run.stdout, run.stdout[-3000:]
    named = [line for line in run.stdout.splitlines() if "sleep 97" in line]
    assert len(named) == 1, run.stdout[-3000:]
    pid = int(named[0].split(":", 1)[0])
    assert not _alive(pid), "the session named it but left it running"
