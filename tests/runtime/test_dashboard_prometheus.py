"""The Grafana dashboard's queries on a real Prometheus (Debian's 2.42) scraping a real agent and the
controller's metrics: every query parses and the metric names (colons included) are scraped as written."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client import generate_latest

from tests.conftest import free_port, serve_app
from tests.runtime.conftest import AgentStarter
from turnout.controller.metrics import ControllerMetrics
from turnout.core.claims import ClaimPhase

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "turnout-modelclaims.json"


@pytest.fixture
async def controller_metrics() -> AsyncIterator[str]:
    metrics = ControllerMetrics()
    metrics.claim("default", "qwen", None, ClaimPhase.ACTIVE)
    metrics.pool("default", "warm-runtime-pool", True)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", serve)
    url, runner = await serve_app(app)
    yield url.removeprefix("http://")
    await runner.cleanup()


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # Grafana's label_values(selector, label) is not PromQL: its selector is
    exprs += [
        re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["query"]["query"]) for v in dashboard["templating"]["list"]
    ]
    return [e.replace("$namespace", ".*").replace("$pool", ".*") for e in exprs]


async def test_dashboard_queries_run_on_real_prometheus(
    start_agent: AgentStarter, controller_metrics: str, tmp_path: Path
) -> None:
    exe = shutil.which("prometheus")
    assert exe is not None, "prometheus not installed (scripts/test installs Debian's package)"
    agent_url, _ = await start_agent()
    agent_target = agent_url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    scrape = [
        {
            "job_name": "runtime",
            "static_configs": [
                {"targets": [agent_target], "labels": {"namespace": "default", "pool": "warm-runtime-pool"}}
            ],
        },
        {"job_name": "controller", "static_configs": [{"targets": [controller_metrics]}]},
    ]
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": scrape}))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        exe,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as http:

            async def query(expr: str) -> dict[str, Any]:
                async with http.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}) as r:
                    body: dict[str, Any] = await r.json()
                    return body

            deadline = time.monotonic() + 60
            ready = False
            while time.monotonic() < deadline:
                try:
                    got = await query('up{job="runtime"} == 1 and on() up{job="controller"} == 1')
                    ready = got.get("status") == "success" and bool(got["data"]["result"])
                except aiohttp.ClientError:
                    ready = False
                if ready:
                    break
                await asyncio.sleep(0.3)
            assert ready, (tmp_path / "prometheus.log").read_text()[-2000:]
            for expr in queries():
                got = await query(expr)
                assert got["status"] == "success", (expr, got)
            resident = await query('aibrix:modelclaim_models_resident{namespace="default"}')
            assert resident["data"]["result"], "the agent's colon-named metrics are scraped as written"
            desired = await query("sum(aibrix_modelclaim_desired_replicas)")
            assert float(desired["data"]["result"][0]["value"][1]) == 1.0
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
        log.close()
