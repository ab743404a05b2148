"""Request activity the agent reads from an engine's own /metrics (vLLM and SGLang exposition formats, served
by a stand-in: neither engine runs on this machine), and what it reports when nothing is observable."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import serve_app
from turnout.runtime.agent import engine_activity
from turnout.runtime.supervisor import EngineRecord, Supervisor

VLLM = """# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 40.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0.0
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} 7.0
"""


@pytest.fixture
async def engine_metrics() -> AsyncIterator[tuple[int, dict[str, str]]]:
    body = {"text": VLLM}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body["text"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    url, runner = await serve_app(app)
    yield int(url.rsplit(":", 1)[1]), body
    await runner.cleanup()


def record(engine: str, port: int, ready: bool = True) -> EngineRecord:
    return EngineRecord("m", engine, "hf://org/m", port, "m", {}, {}, phase="active", ready=ready)


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    sup = Supervisor(tmp_path / "engines.json", tmp_path / "logs", port_range=(40000, 40010))
    yield sup
    await sup.close()


async def test_vllm_and_sglang_counts(engine_metrics: tuple[int, dict[str, str]], supervisor: Supervisor) -> None:
    port, body = engine_metrics
    assert await engine_activity(supervisor, record("vllm", port)) == {"running": 3, "waiting": 2, "success_total": 42}
    body["text"] = SGLANG
    assert await engine_activity(supervisor, record("sglang", port)) == {"running": 1, "waiting": 0, "success_total": 7}


@pytest.mark.parametrize(
    ("engine", "text", "ready"),
    [
        ("llamacpp", VLLM, True),  # llama.cpp's server exports no metrics: never guessed
        ("vllm", VLLM, False),  # an engine that is not ready is not asked
        ("vllm", "# TYPE other gauge\nother 1\n", True),  # counts missing from the exposition
        ("vllm", "not { an exposition", True),
    ],
)
async def test_unobservable_activity_is_null(
    engine_metrics: tuple[int, dict[str, str]], supervisor: Supervisor, engine: str, text: str, ready: bool
) -> None:
    port, body = engine_metrics
    body["text"] = text
    got = await engine_activity(supervisor, record(engine, port, ready))
    assert got == {"running": None, "waiting": None, "success_total": None}


# An exposition as a scraper that rewrites colons writes it, with a second model's series beside ours (an engine
# serving one model never exports another's, but a shared or proxied /metrics does, and must not be summed in).
MIXED = """# TYPE vllm_num_requests_running gauge
vllm_num_requests_running{engine="0",model_name="m"} 1.0
vllm_num_requests_running{engine="0",model_name="other"} 9.0
# TYPE vllm_num_requests_waiting gauge
vllm_num_requests_waiting{engine="0",model_name="m"} 0.0
vllm_num_requests_waiting{engine="0",model_name="other"} 4.0
# TYPE vllm_request_success_total counter
vllm_request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
vllm_request_success_total{engine="0",finished_reason="stop",model_name="other"} 100.0
vllm_request_success_total{engine="0",finished_reason="stop"} 50.0
"""


async def test_activity_counts_only_the_engines_model_in_either_spelling(
    engine_metrics: tuple[int, dict[str, str]], supervisor: Supervisor
) -> None:
    port, body = engine_metrics
    body["text"] = MIXED
    assert await engine_activity(supervisor, record("vllm", port)) == {"running": 1, "waiting": 0, "success_total": 5}
    body["text"] = SGLANG + 'sglang:num_running_reqs{model_name="other"} 8.0\nsglang:num_requests_total 70.0\n'
    assert await engine_activity(supervisor, record("sglang", port)) == {"running": 1, "waiting": 0, "success_total": 7}
    body["text"] = VLLM.replace('model_name="m"', 'model_name="other"')
    got = await engine_activity(supervisor, record("vllm", port))
    assert got == {"running": None, "waiting": None, "success_total": None}  # nothing of this engine's model
