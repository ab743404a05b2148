"""`turnout agent`: the runtime agent of a GPU pool pod (engine processes, their registry and snapshot)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from turnout.cli.common import LogFormatOption, LogLevelOption, fail, valid_host, valid_port

__all__ = ["agent", "register"]


def agent(
    port: Annotated[int, typer.Option(callback=valid_port, help="agent API port")] = 8080,
    host: Annotated[
        str,
        typer.Option(
            callback=valid_host,
            envvar="POD_IP",
            help="bind address of the agent and of its engines; in a pod, set POD_IP (the pod's IP) or 0.0.0.0",
        ),
    ] = "127.0.0.1",
    registry: Annotated[Path, typer.Option(help="engines.json (in pods: /var/run/aibrix/engines.json)")] = Path(
        "turnout-data/engines.json"
    ),
    engine_ports: Annotated[
        str, typer.Option(help="port range for engines, LOW-HIGH (AIBrix runtime's range by default)")
    ] = "20000-20999",
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="the node's weight cache: Hugging Face hub entries and AIBrix served markers "
            "(default: $AIBRIX_WEIGHT_CACHE_DIR, else none)"
        ),
    ] = None,
    mock: Annotated[
        bool,
        typer.Option(
            "--mock",
            help="answer the agent API without launching engines, for tests and demos "
            "(also AIBRIX_MODEL_RUNTIME_MOCK=1)",
        ),
    ] = False,
    engine_python: Annotated[
        list[str] | None,
        typer.Option(help="ENGINE=PYTHON: the interpreter that has this engine installed (repeatable)"),
    ] = None,
    boot_timeout_s: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="seconds an engine may take to answer its health check after it starts or is re-adopted, then it "
            "is killed and restarted (default: the engine's own: vLLM's VLLM_ENGINE_READY_TIMEOUT_S, 600; SGLang "
            "720; llama.cpp 600)",
        ),
    ] = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the runtime agent: one supervised engine process per model claim."""
    from aiohttp import web

    from turnout.config import ConfigError, agent_env
    from turnout.core.runtime import ENGINES
    from turnout.redaction import configure_logging
    from turnout.runtime.agent import create_agent_app

    configure_logging(log_level, log_format)
    low, _, high = engine_ports.partition("-")
    if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
        fail(f"--engine-ports {engine_ports!r}: use LOW-HIGH, e.g. 20000-20999")
    pythons = {}
    for item in engine_python or []:
        engine, sep, exe = item.partition("=")
        if not sep or engine not in ENGINES or not exe:
            fail(f"--engine-python {item!r}: use ENGINE=PATH with ENGINE one of vllm, sglang, llamacpp")
        pythons[engine] = exe
    try:
        env = agent_env()
    except ConfigError as exc:
        fail(str(exc))
    application = create_agent_app(
        registry_path=registry,
        log_dir=registry.parent / "engine-logs",
        port_range=(int(low), int(high)),
        cache_dir=cache_dir if cache_dir is not None else env.weight_cache_dir,
        engine_python=pythons,
        engine_host=host,
        mock=mock or env.mock,
        boot_timeout_s=boot_timeout_s,
    )
    web.run_app(application, host=host, port=port, print=None, access_log=None)


def register(app: typer.Typer) -> None:
    app.command()(agent)
