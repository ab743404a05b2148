"""`turnout serve` starting and stopping, as an operator sees it: the real command in a subprocess.

Workers are the Ollama stand-in (tests/support/ollama_emulator.py: Ollama cannot be installed here) on an
event loop in a background thread; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.support.cli import TURNOUT
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.served import Served
from tests.support.threaded_gateway import LoopThread

CAPS = ("bounding-set", "inh-caps")


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("TURNOUT_ADMIN_TOKEN", "TURNOUT_SECRET_KEY")}
    return {**clean, **extra}


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TURNOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=_env(**env))


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed as a configuration problem should: exit 2, one line on stderr, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "serving on" not in result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("turnout: ")
    return lines[0]


@contextmanager
def served(args: list[str], cwd: Path, **env: str) -> Iterator[Served]:
    process = Served([*TURNOUT, "serve", *args], cwd, _env(**env))
    try:
        yield process
    finally:
        process.kill()


@contextmanager
def ollama(behaviour: Behaviour) -> Iterator[OllamaEmulator]:
    loop = LoopThread()
    emulator = OllamaEmulator("emu", behaviour)
    try:
        loop.run(emulator.start)
        yield emulator
    finally:
        loop.run(emulator.stop)
        loop.stop()


def write_config(tmp: Path, **sections: Any) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps({"storage": {"data_dir": "state"}, **sections}))
    return path


# -- start-up ---------------------------------------------------------------------------------------------


def test_serving_on_is_printed_once_the_port_answers(tmp_path: Path) -> None:
    # The worker's listing answers after 1.5 s, so the gateway's start-up (one poll of every worker) takes that
    # long: "serving on" must come after it, on a socket that is already bound.
    with ollama(Behaviour(tags_hang_s=1.5, version_hang_s=1.5)) as emulator:
        config = write_config(tmp_path, workers=[{"name": "w", "url": emulator.url}], health={"timeout_s": 5})
        port = free_port()
        with served(["--config", str(config), "--port", str(port)], tmp_path) as gateway:
            gateway.wait_for("serving on")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:  # no retry
                assert json.load(resp)["workers"] == 1
            assert gateway.stop() == 0


def test_a_busy_port_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = one_line_error(run(["serve", "--config", str(config), "--port", str(port)], tmp_path))
    assert f"127.0.0.1:{port}" in line and "in use" in line and "--port" in line
    assert not (tmp_path / "state").exists()  # no token, no store, no starter key


def test_an_invalid_secret_key_is_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    line = one_line_error(
        run(["serve", "--config", str(config), "--port", str(free_port())], tmp_path, TURNOUT_SECRET_KEY="hunter2")
    )
    assert "TURNOUT_SECRET_KEY" in line and "unset it" in line and "hunter2" not in line
    checked = run(["config", "check", "--config", str(config)], tmp_path, TURNOUT_SECRET_KEY="hunter2")
    assert checked.returncode == 2 and "TURNOUT_SECRET_KEY" in checked.stderr


@pytest.mark.parametrize(
    ("data_dir", "problem"),
    [("afile", "is a file"), ("afile/state", "not a directory")],
    ids=["a-file", "under-a-file"],
)
def test_an_unusable_data_dir_is_one_line(tmp_path: Path, data_dir: str, problem: str) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": data_dir}}))
    line = one_line_error(run(["serve", "--config", str(config), "--port", str(free_port())], tmp_path))
    assert str(tmp_path / data_dir) in line and problem in line and "storage.data_dir" in line


def test_an_unreadable_data_dir_is_one_line(tmp_path: Path) -> None:
    # As root, file modes do not stop the process: drop the capabilities that bypass them (setpriv, util-linux)
    # so that a mode-000 directory is as unreadable to this root process as to any other user.
    as_user = [] if os.geteuid() != 0 else ["setpriv", *(f"--{s}=-dac_override,-dac_read_search" for s in CAPS)]
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0)
    config = write_config(tmp_path)
    try:
        result = subprocess.run(
            [*as_user, *TURNOUT, "serve", "--config", str(config), "--port", str(free_port())],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
        )
    finally:
        state.chmod(0o755)
    line = one_line_error(result)
    assert str(state) in line and "permission denied" in line and "storage.data_dir" in line


def test_first_start_says_where_the_turnout_command_is(tmp_path: Path) -> None:
    port = free_port()
    with served(["--port", str(port), "--no-demo"], tmp_path, PATH="/usr/bin:/bin") as gateway:
        gateway.wait_for("serving on")
        assert gateway.stop() == 0
    script = Path(sys.executable).parent / "turnout"
    assert script.exists()  # the test environment has the package installed, as ./scripts/serve does
    assert any("turnout worker add NAME --url URL" in line for line in gateway.lines)  # the starter config's note
    # the new store's migration is one line of ours, not Alembic's line per step and per plugin
    assert [line for line in gateway.lines if "schema (new) -> " in line]
    assert not [line for line in gateway.lines if "alembic" in line]
    hint = next(line for line in gateway.lines if "the turnout command is" in line)
    assert str(script) in hint
    if sys.prefix != sys.base_prefix:
        assert f"source {Path(sys.prefix) / 'bin' / 'activate'}" in hint
    with served(["--port", str(free_port()), "--no-demo"], tmp_path, PATH="/usr/bin:/bin") as again:
        again.wait_for("serving on")
        again.stop()
    assert not any("the turnout command is" in line for line in again.lines)  # first start only


@pytest.mark.parametrize(("level", "shown", "hidden"), [("debug", "DEBUG", None), ("warning", None, "INFO")])
def test_log_level(tmp_path: Path, level: str, shown: str | None, hidden: str | None) -> None:
    config = write_config(tmp_path)
    with served(["--config", str(config), "--port", str(free_port()), "--log-level", level], tmp_path) as gateway:
        gateway.wait_for("serving on")
        assert gateway.stop() == 0
    levels = {line.split()[2] for line in gateway.lines if line[:4].isdigit() and len(line.split()) > 2}
    if shown:
        assert shown in levels, gateway.lines
    if hidden:
        assert hidden not in levels and levels <= {"WARNING", "ERROR", "CRITICAL"}, gateway.lines


# -- stopping ---------------------------------------------------------------------------------------------


def _stream(port: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    conn.request("POST", "/api/chat", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stop_finishes_a_stream_in_flight_then_says_it_stopped(tmp_path: Path, sig: int) -> None:
    with ollama(Behaviour(tokens=12, token_delay_s=0.15)) as emulator:
        config = write_config(tmp_path, auth={"open": True}, workers=[{"name": "w", "url": emulator.url}])
        port = free_port()
        with served(["--config", str(config), "--port", str(port)], tmp_path) as gateway:
            gateway.wait_for("serving on")
            conn, resp = _stream(port)
            first = json.loads(resp.readline())
            assert first["done"] is False
            gateway.proc.send_signal(sig)
            gateway.wait_for("stopping: 1 request in flight")
            with pytest.raises(OSError):  # no new connections while draining
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            rest = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
            conn.close()
            assert rest[-1]["done"] is True  # the whole answer, to its final stats object
            assert len(rest) + 1 == 13
            assert gateway.wait() == 0
    assert gateway.lines[-1] == "turnout: stopped after the 1 request in flight finished"
    assert not any("Traceback" in line for line in gateway.lines)


def test_stop_closes_what_outlasts_the_drain_timeout(tmp_path: Path) -> None:
    with ollama(Behaviour(tokens=200, token_delay_s=0.1)) as emulator:  # a 20 s answer
        config = write_config(tmp_path, auth={"open": True}, workers=[{"name": "w", "url": emulator.url}])
        port = free_port()
        args = ["--config", str(config), "--port", str(port), "--drain-timeout", "1"]
        with served(args, tmp_path) as gateway:
            gateway.wait_for("serving on")
            conn, resp = _stream(port)
            assert json.loads(resp.readline())["done"] is False
            started = time.monotonic()
            assert gateway.stop(signal.SIGINT, limit_s=15) == 0
            took = time.monotonic() - started
            try:
                rest = resp.read()
            except http.client.IncompleteRead as exc:
                rest = exc.partial
            conn.close()
    assert took < 10  # bounded: 1 s to finish, then closed (not the 20 s the answer would take)
    assert b'"done":true' not in rest.replace(b" ", b"")
    last = json.loads(rest.splitlines()[-1])  # not a silent cut: the stream's last line says why (Ollama's error)
    assert "gateway stopped" in last["error"], last
    assert gateway.lines[-1] == "turnout: stopped; closed 1 request still running after 1 s"
    assert not any("Traceback" in line for line in gateway.lines)


def test_drain_timeout_is_checked(tmp_path: Path) -> None:
    result = run(["serve", "--drain-timeout", "nan"], tmp_path)
    assert result.returncode == 2 and "--drain-timeout" in result.stderr
