"""`turnout serve --workers 2`: the real command, two gateway processes on one port (turnout.gateway.processes).

Requests go over fresh connections, which the kernel spreads over the processes' SO_REUSEPORT sockets; each
process's access log lines name its pid, so a test can tell which process served what. The worker is the
Ollama stand-in (tests/support/ollama_emulator.py) on the test's own event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, eventually, free_port
from tests.support.cli import TURNOUT
from tests.support.served import Served
from turnout.config import Settings
from turnout.gateway.processes import processes_problem
from turnout.store.db import Database, database_url
from turnout.store.keys import KeyStore

TOKEN = "admin-token-for-tests"
CHAT = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
ACCESS = re.compile(r'turnout\.access\[(\d+)\]: \S+ "(\w+) (\S+) HTTP/1\.1" (\d+)')


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TURNOUT_SECRET_KEY",)}
    return {**env, "TURNOUT_ADMIN_TOKEN": TOKEN}


def _config(tmp: Path, **sections: Any) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps({"storage": {"data_dir": str(tmp / "data")}, **sections}))
    return path


def _key(tmp: Path, **limits: Any) -> str:
    db = Database(database_url(None, tmp / "data"))
    db.migrate()
    try:
        return KeyStore(db).create(
            app="load",
            tenant=None,
            scopes=["*"],
            rpm=limits.get("rpm"),
            daily_tokens=None,
            expires_at=None,
            now=time.time(),
        )[1]
    finally:
        db.close()


@contextmanager
def two_processes(config: Path, port: int, *extra: str) -> Iterator[Served]:
    gateway = Served(
        [*TURNOUT, "serve", "--config", str(config), "--port", str(port), "--workers", "2", *extra],
        config.parent,
        _env(),
    )
    try:
        yield gateway
    finally:
        gateway.kill()
        for pid in _children(gateway.proc.pid):
            with contextlib.suppress(ProcessLookupError):  # it may be gone already
                os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def _pids(url: str, want: int = 2, tries: int = 200) -> set[int]:
    """The pids that answer /healthz over fresh connections (until ``want`` differ, at most ``tries``)."""
    seen: set[int] = set()
    for _ in range(tries):
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
            http.get(f"{url}/healthz") as r,
        ):
            seen.add((await r.json())["pid"])
        if len(seen) >= want:
            break
    return seen


async def _started(gateway: Served) -> None:
    await asyncio.to_thread(gateway.wait_for, "serving on", 60)


def _access(lines: list[str], path: str) -> list[tuple[int, int]]:
    """(pid, status) of each access log line for ``path``."""
    return [(int(m[1]), int(m[4])) for line in lines if (m := ACCESS.search(line)) and m[3] == path]


async def _stop(gateway: Served) -> int:
    return await asyncio.to_thread(gateway.stop, signal.SIGTERM, 60)


async def _fresh(method: str, url: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key or TOKEN}"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=headers) as http,
        http.request(method, url, json=body) as r,
    ):
        return r.status, await r.json(content_type=None)


# -- limits ----------------------------------------------------------------------------------------------------


async def test_rpm_is_exact_across_two_processes(emulator: EmulatorFactory, tmp_path: Path) -> None:
    emu = await emulator("a", ["qwen3:8b"], token_delay_s=0.002)
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}])
    key = _key(tmp_path, rpm=50)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        assert len(await _pids(url)) == 2  # two processes answer on the one port
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {key}"}, connector=aiohttp.TCPConnector(limit=0, force_close=True)
        ) as http:

            async def one() -> int:
                async with http.post(f"{url}/v1/chat/completions", json=CHAT) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(one() for _ in range(200)))
        assert await _stop(gateway) == 0
    assert statuses.count(200) == 50 and statuses.count(429) == 150
    assert emu.served("/v1/chat/completions") == 50
    served = _access(gateway.lines, "/v1/chat/completions")
    assert len(served) == 200
    per_process = Counter(pid for pid, _ in served)
    assert len(per_process) == 2, per_process  # both processes took requests, and together admitted 50
    assert gateway.lines[-1] == "turnout: stopped"


async def test_the_counts_outlive_a_crashed_process(emulator: EmulatorFactory, tmp_path: Path) -> None:
    """The supervisor keeps the limits: a process that crashes and is started again does not give the key its
    minute back."""
    emu = await emulator("a", ["qwen3:8b"])
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}])
    key = _key(tmp_path, rpm=20)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    chat = f"{url}/v1/chat/completions"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        before = [(await _fresh("POST", chat, key, CHAT))[0] for _ in range(12)]
        victim = min(await _pids(url))
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(gateway.wait_for, "starting it again", 30)

        async def replaced() -> bool:
            now = await _pids(url)
            return len(now) == 2 and victim not in now

        await eventually(replaced, "the crashed process's replacement", limit_s=30)
        after = [(await _fresh("POST", chat, key, CHAT))[0] for _ in range(12)]
        assert await _stop(gateway) == 0
    assert before == [200] * 12
    assert after == [200] * 8 + [429] * 4, after
    assert emu.served("/v1/chat/completions") == 20


# -- admin changes reach every process ------------------------------------------------------------------------


async def test_a_placement_override_written_through_one_process_is_obeyed_by_both(
    emulator: EmulatorFactory, tmp_path: Path
) -> None:
    emu = await emulator("a", ["qwen3:8b", "llama3.2:latest"])
    # health polls (which also re-read the override file) far apart: only the change counter can tell the others
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}], health={"interval_s": 600})
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        warm = [await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT) for _ in range(20)]
        assert {s for s, _ in warm} == {200}
        override = {"mode": "allow_all", "allowed_models": [], "denied_models": ["qwen3:8b"]}
        status, _ = await _fresh("PUT", f"{url}/admin/api/placement/workers/a", body=override)
        assert status == 200
        served_before = emu.served("/v1/chat/completions")
        after = [await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT) for _ in range(20)]
        assert await _stop(gateway) == 0
    assert all(s != 200 for s, _ in after), after
    assert emu.served("/v1/chat/completions") == served_before
    refused = _access(gateway.lines, "/v1/chat/completions")[-20:]
    assert len({pid for pid, _ in refused}) == 2  # refused by both processes, not just the one that wrote it


async def test_a_key_revoked_through_one_process_is_refused_by_both(emulator: EmulatorFactory, tmp_path: Path) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    # a long key cache: without the change counter the other process would keep accepting the key
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}], auth={"key_cache_s": 600})
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        warm = [await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT) for _ in range(20)]
        assert {s for s, _ in warm} == {200}  # both processes have the key cached now (checked below)
        listed = await _fresh("GET", f"{url}/admin/api/keys")
        ref = next(k["id"] for k in listed[1]["keys"] if key.startswith(k["prefix"]))
        status, _ = await _fresh("POST", f"{url}/admin/api/keys/{ref}/revoke", body={})
        assert status == 200
        after = [await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT) for _ in range(20)]
        assert await _stop(gateway) == 0
    assert {s for s, _ in after} == {401}, after
    chat = _access(gateway.lines, "/v1/chat/completions")
    assert len({pid for pid, s in chat[:20] if s == 200}) == 2
    assert len({pid for pid, s in chat[-20:] if s == 401}) == 2


# -- the supervisor ---------------------------------------------------------------------------------------------


async def test_a_crashed_process_is_started_again(emulator: EmulatorFactory, tmp_path: Path) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        before = await _pids(url)
        assert before == set(_children(gateway.proc.pid))
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        line = await asyncio.to_thread(gateway.wait_for, "starting it again", 30)
        assert f"(pid {victim}) ended with signal SIGKILL" in line
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = await _pids(url)
            if len(now) == 2 and victim not in now:
                break
        assert len(now) == 2 and victim not in now and (before - {victim}) < now
        assert await _stop(gateway) == 0


async def test_sigterm_drains_a_stream_in_flight_and_exits_0(emulator: EmulatorFactory, tmp_path: Path) -> None:
    emu = await emulator("a", ["qwen3:8b"], tokens=20, token_delay_s=0.1)
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}], auth={"open": True})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        children = _children(gateway.proc.pid)
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/api/chat", json={**CHAT, "stream": True}) as r,
        ):
            first = await r.content.readline()
            gateway.proc.send_signal(signal.SIGTERM)
            rest = await r.content.read()
        code = await asyncio.to_thread(gateway.wait, 60)
    lines = [json.loads(x) for x in (first + rest).splitlines() if x.strip()]
    assert lines[-1]["done"] is True and len(lines) == 21
    assert code == 0
    assert "turnout: stopped after the 1 request in flight finished" in gateway.lines
    assert not any(_alive(pid) for pid in children)


# -- refusals: one line, exit 2, nothing served -----------------------------------------------------------------


def _refused(args: list[str], cwd: Path) -> str:
    result = subprocess.run(
        [*TURNOUT, "serve", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "serving on" not in result.stdout and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnout: "), lines
    return lines[0]


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        (
            {"pools": {"agents": [{"name": "p", "agent_url": "http://127.0.0.1:9", "address": "127.0.0.1"}]}},
            "pools.agents runs the claims controller inside the gateway",
        ),
    ],
    ids=["in-process-controller"],
)
def test_a_config_that_cannot_run_as_two_processes_is_refused(
    tmp_path: Path, sections: dict[str, Any], says: str
) -> None:
    line = _refused(
        ["--config", str(_config(tmp_path, **sections)), "--port", str(free_port()), "--workers", "2"], tmp_path
    )
    assert says in line and "--workers 1" in line
    assert not (tmp_path / "data").exists()


def test_a_busy_port_is_one_line_with_two_processes(tmp_path: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = _refused(["--config", str(_config(tmp_path)), "--port", str(port), "--workers", "2"], tmp_path)
    assert "in use" in line and "--port" in line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("value", ["-1", "two", "257"])
def test_workers_is_checked(tmp_path: Path, value: str) -> None:
    result = subprocess.run(
        [*TURNOUT, "serve", "--workers", value],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert result.returncode == 2 and "--workers" in result.stderr


# -- the plan: pure parts ---------------------------------------------------------------------------------------


async def test_a_cap_is_exact_and_work_conserving_across_two_processes(
    emulator: EmulatorFactory, tmp_path: Path
) -> None:
    """One slot on a worker (max_concurrent 1) and two processes: never two requests on it at once, and every
    request served, whichever process it reached (the supervisor keeps one count and one queue; the split that
    gave each process half a cap is gone: a cap below the processes is no longer refused)."""
    emu = await emulator("a", ["qwen3:8b"], token_delay_s=0.01)
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url, "max_concurrent": 1}])
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        assert len(await _pids(url)) == 2
        results = await asyncio.gather(*(_fresh("POST", f"{url}/api/chat", key, CHAT) for _ in range(12)))
        assert await _stop(gateway) == 0
    assert [status for status, _ in results] == [200] * 12
    assert emu.peak_active == 1
    served_by = {pid for pid, status in _access(gateway.lines, "/api/chat") if status == 200}
    assert len(served_by) == 2  # both processes took requests through the one slot
    assert processes_problem(Settings.model_validate({"routing": {"max_concurrent": 1}}), 2) is None
