"""Commands in a network namespace of their own (``unshare --net``, loopback up), and commands entering it.

For tests of what `turnout serve` does depending on what answers at fixed loopback addresses (Ollama's
127.0.0.1:11434, the gateway's 8080): in a namespace of its own nothing else on this shared machine answers there,
and the test decides what does. Needs root and util-linux (unshare, nsenter, setpriv), as CI has."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

__all__ = ["WITH_LISTENER", "enter", "isolated", "require"]

# Loopback up, then the command; with WITH_LISTENER first, something answering HTTP on port $LISTEN_PORT (a
# plain file server: an answer of any kind is an answer). The listener is a child of the shell, which then
# becomes the command (exec, same process), and asks the kernel (setpriv --pdeathsig, PR_SET_PDEATHSIG) to be
# killed when that process ends, however it ends (a test's kill included): it never outlives the command, nor
# keeps its network namespace alive.
_UP = "ip link set lo up"
WITH_LISTENER = (
    f"{_UP} && "
    f'{{ setpriv --pdeathsig KILL -- {sys.executable} -m http.server "$LISTEN_PORT" --bind 127.0.0.1 '
    ">/dev/null 2>&1 & } && "
    'for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$LISTEN_PORT") 2>/dev/null && break; sleep 0.1; done && '
    'exec "$@"'
)


def require() -> None:
    if os.geteuid() != 0 or any(shutil.which(tool) is None for tool in ("unshare", "nsenter", "setpriv")):
        pytest.fail("these tests need root and util-linux (unshare, nsenter, setpriv): run them as CI does")


def isolated(argv: list[str], *, prelude: str = f'{_UP} && exec "$@"') -> list[str]:
    """``argv`` run in a new network namespace (``prelude`` runs first, in bash, and execs ``"$@"``)."""
    return ["unshare", "--net", "--", "bash", "-c", prelude, "netns", *argv]


def enter(pid: int, argv: list[str]) -> list[str]:
    """``argv`` run in the network namespace of process ``pid``."""
    return ["nsenter", f"--net=/proc/{pid}/ns/net", "--", *argv]
