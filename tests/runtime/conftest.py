"""A real runtime agent for the runtime tests (engines are real llama.cpp processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import free_port
from turnout.runtime.agent import SUPERVISOR, create_agent_app

AgentStarter = Callable[[], Awaitable[tuple[str, web.AppRunner]]]


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[AgentStarter]:
    """Starts agents sharing one registry (a second call is an agent restart); stops every engine at the end."""
    runners: list[web.AppRunner] = []
    low = free_port()

    async def start() -> tuple[str, web.AppRunner]:
        app = create_agent_app(
            registry_path=tmp_path / "agent" / "engines.json",
            log_dir=tmp_path / "agent" / "logs",
            port_range=(low, low + 20),
            backoff_base_s=0.05,
        )
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}", runner

    yield start
    if runners:
        await runners[-1].app[SUPERVISOR].stop_all()
    for runner in runners:
        await runner.cleanup()
