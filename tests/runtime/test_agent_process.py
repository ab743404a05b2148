"""`turnout agent` as a real process: SIGKILL it, start another on the same registry, and its engines (real
llama.cpp processes in their own sessions) are re-adopted with the same PIDs and ports, never restarted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually, free_port
from tests.runtime.test_agent import activate_body, chat


class AgentProcess:
    def __init__(self, registry: Path, engine_ports: str, pod_ip: str | None = None, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://[{pod_ip}]:{self.port}" if pod_ip else f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "POD_IP"}
        self.log = (registry.parent / f"agent-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turnout",
                "agent",
                "--port",
                str(self.port),
                "--registry",
                str(registry),
                "--engine-ports",
                engine_ports,
                *extra,
            ],
            env={**env, "POD_IP": pod_ip} if pod_ip else env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as http, http.request(method, f"{self.url}{path}", json=body) as r:
            return r.status, await r.json()

    async def until(self, check: Callable[[dict[str, Any]], bool], limit_s: float = 60) -> dict[str, Any]:
        async def engines() -> tuple[dict[str, Any]] | None:  # a tuple: no engines at all may be the answer
            with contextlib.suppress(aiohttp.ClientError):  # the agent may not be listening yet
                _, body = await self.call("GET", "/v1/runtime/models")
                found = {e["model_name"]: e for e in body["models"]}
                return (found,) if check(found) else None
            return None

        (found,) = await eventually(engines, "the agent's engines", limit_s)
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
async def agents(tmp_path: Path) -> AsyncIterator[Callable[..., AgentProcess]]:
    registry = tmp_path / "agent" / "engines.json"
    registry.parent.mkdir()
    low = free_port()
    started: list[AgentProcess] = []

    def start(pod_ip: str | None = None, *extra: str) -> AgentProcess:
        started.append(AgentProcess(registry, f"{low}-{low + 20}", pod_ip, *extra))
        return started[-1]

    yield start
    for agent in started:
        agent.stop()
    # whatever the test left: every engine group in the registry goes (they outlive agents by design)
    with contextlib.suppress(FileNotFoundError):
        for engine in json.loads(registry.read_text())["engines"]:
            if engine.get("pid"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(engine["pid"], signal.SIGKILL)


def both_active(engines: dict[str, Any]) -> bool:
    return all(engines.get(n, {}).get("phase") == "active" for n in ("alpha", "beta"))


async def test_sigkilled_agent_is_replaced_and_engines_are_readopted(
    agents: Callable[..., AgentProcess], tiny_model: Path
) -> None:
    first = agents()
    await first.until(lambda engines: True, limit_s=30)  # the API answers
    for name in ("alpha", "beta"):
        status, _ = await first.call("POST", "/v1/runtime/models/activate", activate_body(name, tiny_model))
        assert status == 200
    before = await first.until(both_active)

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    for name in ("alpha", "beta"):  # engines keep serving with no agent at all
        assert await chat(before[name]["port"], name) == 200

    second = agents()
    after = await second.until(both_active, limit_s=30)
    for name in ("alpha", "beta"):
        assert after[name]["pid"] == before[name]["pid"], "re-adopted, not restarted"
        assert after[name]["port"] == before[name]["port"] and after[name]["ipc_name"] == before[name]["ipc_name"]
        # (not counted again: an engine that had to start again once before, its port taken by another process on
        # this shared machine between the agent's check and its bind, comes with its count: CI saw 1 here)
        assert after[name]["restart_count"] == before[name]["restart_count"]
        assert await chat(after[name]["port"], name) == 200

    # the new agent supervises what it adopted: a crash of an adopted engine is restarted on the same port
    os.killpg(after["alpha"]["pid"], signal.SIGKILL)
    restarted = await second.until(lambda e: e["alpha"]["restart_count"] == 1 and e["alpha"]["phase"] == "active")
    assert restarted["alpha"]["port"] == before["alpha"]["port"] and restarted["alpha"]["pid"] != before["alpha"]["pid"]
    assert restarted["beta"]["pid"] == before["beta"]["pid"]
    for name in ("alpha", "beta"):
        status, _ = await second.call("POST", "/v1/runtime/models/deactivate", {"model_name": name})
        assert status == 200


async def test_agent_logs_one_json_object_a_line(agents: Callable[..., AgentProcess], tiny_model: Path) -> None:
    """`turnout agent --log-format json` (as serve, the controller and the operator take it): a log collector in
    the cluster reads every line as one record."""
    agent = agents(None, "--mock", "--log-format", "json", "--log-level", "debug")
    await agent.until(lambda engines: True, limit_s=30)
    status, _ = await agent.call("POST", "/v1/runtime/models/activate", activate_body("alpha", tiny_model))
    assert status == 200
    await agent.until(lambda engines: engines.get("alpha", {}).get("phase") == "active")
    agent.stop()
    lines = (await asyncio.to_thread(Path(agent.log.name).read_text)).splitlines()
    records = [json.loads(line) for line in lines]  # every line, not only some
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records), lines


async def refused(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def test_agent_and_its_engines_listen_on_the_pod_address(
    agents: Callable[..., AgentProcess], tiny_model: Path
) -> None:
    # In a pod, POD_IP (the downward API's status.podIP) is the agent's default --host; ::1 stands in for it
    # here (tests talk to loopback only) because it differs from the 127.0.0.1 the agent used to bind.
    agent = agents(pod_ip="::1")
    await agent.until(lambda engines: True, limit_s=30)
    assert await refused("127.0.0.1", agent.port)
    status, _ = await agent.call("POST", "/v1/runtime/models/activate", activate_body("alpha", tiny_model))
    assert status == 200
    engine = (await agent.until(lambda e: e.get("alpha", {}).get("phase") == "active"))["alpha"]
    assert engine["listen_address"] == f"[::1]:{engine['port']}"  # the snapshot says where it listens
    body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://[::1]:{engine['port']}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        assert r.status == 200  # where the gateway is told the engine is: the pod's address
    assert await refused("127.0.0.1", engine["port"])  # the engine follows the agent, not a fixed loopback
    status, _ = await agent.call("POST", "/v1/runtime/models/deactivate", {"model_name": "alpha"})
    assert status == 200
