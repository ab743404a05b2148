"""A real runtime agent for the runtime tests (engines are real llama.cpp or vLLM processes, or the vLLM and
SGLang stand-ins of tests/support/engine_emulator.py where the real server cannot run here)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import free_port, serve_app
from turnout.runtime.agent import SUPERVISOR, create_agent_app

AgentStarter = Callable[..., Awaitable[tuple[str, web.AppRunner]]]
ROOT = Path(__file__).resolve().parents[2]


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
            **{"state_poll_s": 0.2, **options},
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


@pytest.fixture
def emulator_python(tmp_path: Path) -> str:
    """An "interpreter" for ``--engine-python vllm=... sglang=...``: the agent runs ``PYTHON -m MODULE ARGS``
    and this runs the stand-in server for MODULE with those arguments instead (``PYTHON -c CODE`` runs the code,
    with ``EMULATOR_PYTHONPATH`` on its path: see ``kvcached_on_path``)."""
    wrapper = tmp_path / "emulator-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH={shlex.quote(str(ROOT))}"${{EMULATOR_PYTHONPATH:+:$EMULATOR_PYTHONPATH}}" '
        f'exec {shlex.quote(sys.executable)} -m tests.support.engine_emulator "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture
def kvcached_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package named ``kvcached`` on the path of ``emulator_python``: the agent's question to an engine's
    interpreter (can it import kvcached?) is answered yes, as on the kvcached runtime image. Nothing of kvcached
    runs here (it needs CUDA); the engines are the stand-ins."""
    site = tmp_path / "kvcached-site"
    (site / "kvcached").mkdir(parents=True)
    (site / "kvcached" / "__init__.py").write_text('"""Stands in for the kvcached package (found, never used)."""\n')
    monkeypatch.setenv("EMULATOR_PYTHONPATH", str(site))
    return site
