"""A real runtime agent for the runtime tests (engines are real llama.cpp or vLLM processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import free_port, serve_app
from turnout.runtime.agent import SUPERVISOR, create_agent_app

AgentStarter = Callable[..., Awaitable[tuple[str, web.AppRunner]]]


@asynccontextmanager
async def agents(tmp_path: Path) -> AsyncIterator[AgentStarter]:
    """Starts agents sharing one registry (a second call is an agent restart); stops every engine at the end."""
    runners: list[web.AppRunner] = []
    low = free_port()

    async def start(**options: Any) -> tuple[str, web.AppRunner]:
        app = create_agent_app(
            registry_path=tmp_path / "agent" / "engines.json",
            log_dir=tmp_path / "agent" / "logs",
            port_range=(low, low + 20),
            backoff_base_s=0.05,
            **options,
        )
        url, runner = await serve_app(app)
        runners.append(runner)
        return url, runner

    try:
        yield start
    finally:
        if runners:
            await runners[-1].app[SUPERVISOR].stop_all()
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[AgentStarter]:
    async with agents(tmp_path) as start:
        yield start
