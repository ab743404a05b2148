"""The `turnout` command as a user runs it, for the CLI tests: a command in a subprocess, and a real gateway
process (`turnout serve --config ...`) listening where its config says, so the CLI finds it there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import free_port

TURNOUT = [sys.executable, "-m", "turnout"]
# what the test's own shell must not pass on: the tests say which environment each process gets
_SCRUBBED = (
    "TURNOUT_ADMIN_TOKEN",
    "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS",
    "TURNOUT_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS",
)


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in _SCRUBBED}, **extra}


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TURNOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=_env(env))


def write_config(path: Path, **sections: Any) -> Path:
    """A config whose gateway listens on a free loopback port (nothing is there until a test starts it)."""
    body = {"storage": {"data_dir": "state"}, "listen": {"host": "127.0.0.1", "port": free_port()}, **sections}
    path.write_text(json.dumps(body))
    return path


def gateway_url(config: Path) -> str:
    listen = json.loads(config.read_text())["listen"]
    return f"http://{listen['host']}:{listen['port']}"


@contextmanager
def serving(config: Path, *args: str, url: str | None = None, **env: str) -> Iterator[list[str]]:
    """Run `turnout serve --config CONFIG [ARGS]` until the block ends (it answers at ``url``, else where the config
    says); yields its output lines (once stopped)."""
    proc = subprocess.Popen(
        [*TURNOUT, "serve", "--config", str(config), *args],
        cwd=config.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(env),
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"turnout serve exited early: {proc.communicate()[0][-2000:]}"
            try:
                with urllib.request.urlopen(f"{url or gateway_url(config)}/healthz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "turnout serve did not answer in 60 s"
                time.sleep(0.1)
        yield output
    finally:
        proc.terminate()
        try:
            output.extend(proc.communicate(timeout=30)[0].splitlines())
        except subprocess.TimeoutExpired:
            proc.kill()
            output.extend(proc.communicate()[0].splitlines())


def call(url: str, key: str | None = None) -> tuple[int, str]:
    """The HTTP status and body of GET ``url`` (with the key as a bearer token, when given)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
