"""How each engine is started, probed, put to sleep and woken.

Upstream sources the details follow (cited where used): vLLM ``vllm/entrypoints/serve/dev/sleep/api_router.py``
(``/sleep``, ``/wake_up``, ``/is_sleeping``, registered only with ``VLLM_SERVER_DEV_MODE=1``),
``vllm/entrypoints/serve/instrumentator/health.py`` (``/health`` is 503 only for a dead engine, 200 while it
sleeps), ``vllm/v1/metrics/loggers.py`` (``model_name`` label), ``vllm/envs.py`` (``VLLM_ENGINE_READY_TIMEOUT_S``,
its boot timeout); SGLang
``python/sglang/srt/entrypoints/http_server.py`` (``/health`` runs a one-token generation, polled every second for
up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` = 20 s; ``/metrics`` only with ``--enable-metrics``; its warmup kills the
server when it fails) and
``python/sglang/srt/metrics/collector.py`` (``model_name`` label).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from turnout.core.runtime import engine_args, sleeps_in_place

__all__ = ["Launch", "artifact_path", "connect_host", "launch_command", "vllm_ready_timeout_s"]


@dataclass(frozen=True, slots=True)
class Launch:
    argv: list[str]
    health_path: str
    sleep_api: bool  # the engine can sleep in place (vLLM, SGLang); llama.cpp is stopped and restarted
    # Prometheus sample names for (running, waiting, completed) requests; None: the engine exports none.
    activity: tuple[str, str, str] | None = None
    health_timeout_s: float = 2.0  # how long one readiness probe may take
    sleep_state_path: str | None = None  # GET answers {"is_sleeping": bool} (vLLM with sleep mode)
    # How long it may take from its start to answering its health check: the engine's own boot timeout, after
    # which the agent kills it and restarts it like a crashed one (also an engine a restarted agent adopts).
    boot_timeout_s: float = 600.0
    boot_timeout_from: str = "llama.cpp has none of its own: vLLM's default"


def artifact_path(url: str) -> str:
    """What the engine is given: a local path for file://, the model id for hf:// and huggingface://."""
    for scheme in ("huggingface://", "hf://"):
        if url.startswith(scheme):
            return url.removeprefix(scheme)
    if url.startswith("file://"):
        return url.removeprefix("file://")
    return url  # s3:// is staged by the agent first (turnout.runtime.artifacts); a mock engine gets it as is


def vllm_ready_timeout_s() -> float:
    """vLLM's own boot timeout: ``VLLM_ENGINE_READY_TIMEOUT_S`` (vllm/envs.py, default 600 s: how long its API
    server waits for the engine core, which loads the model, before it gives up and exits). Engines inherit the
    agent's environment, so this is the value the engine itself goes by."""
    try:
        value = float(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S", "600"))
    except ValueError:
        return 600.0
    return value if value > 0 else 600.0


# SGLang kills itself when its warmup fails (python/sglang/srt/entrypoints/http_server.py,
# _execute_server_warmup): up to 120 tries, a second apart, for its own HTTP server to answer, then a warmup
# generation with a 600 s timeout.
SGLANG_BOOT_TIMEOUT_S = 120.0 + 600.0

# SGLang's /health waits for a one-token generation, checking every second for up to SGLANG_HEALTH_CHECK_TIMEOUT
# (default 20 s) before it answers 503 (python/sglang/srt/entrypoints/http_server.py, health_generate): a probe
# must wait longer than that, or a busy but healthy engine reads as not ready.
SGLANG_HEALTH_TIMEOUT_S = 25.0


def connect_host(bind_host: str) -> str:
    """Where this machine reaches a server bound to ``bind_host`` (a wildcard is reached on loopback)."""
    if bind_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


def launch_command(
    engine: str,
    model_name: str,
    artifact_url: str,
    port: int,
    args: dict[str, str],
    python: str | None = None,
    host: str = "127.0.0.1",
) -> Launch:
    """How to start the engine. ``python`` is the interpreter that has the engine installed (default: the
    agent's own); ``host`` is where the engine listens (the agent's own bind address, so an agent reachable
    from the gateway has engines reachable from it too). A vLLM claim with ``--no-enable-sleep-mode``
    (platforms without sleep mode, such as CPU) sleeps the way llama.cpp does: the process stops and starts
    again."""
    model = artifact_path(artifact_url)
    extra = engine_args(args)
    exe = python or sys.executable
    if engine == "llamacpp":
        # llama.cpp's own server from the xllamacpp wheel (turnout.runtime.llamacpp_server): the claim's args are
        # llama-server's flags, judged at validation (turnout.core.llamacpp_flags). llama-server's /health is 503
        # while the model loads, 200 once it serves (tools/server/server.cpp); it has no sleep API.
        return Launch(
            [
                exe,
                "-m",
                "turnout.runtime.llamacpp_server",
                "--model",
                model,
                "--host",
                host,
                "--port",
                str(port),
                "--alias",
                model_name,
                *extra,
            ],
            "/health",
            False,
        )
    if engine == "vllm":
        sleeps = sleeps_in_place(engine, args)
        return Launch(
            [
                exe,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                model,
                "--served-model-name",
                model_name,
                "--host",
                host,
                "--port",
                str(port),
                "--enable-sleep-mode",
                *extra,
            ],
            "/health",
            sleeps,
            ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total"),
            sleep_state_path="/is_sleeping" if sleeps else None,
            boot_timeout_s=vllm_ready_timeout_s(),
            boot_timeout_from="vLLM's VLLM_ENGINE_READY_TIMEOUT_S",
        )
    return Launch(
        [
            exe,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            "--served-model-name",
            model_name,
            "--host",
            host,
            "--port",
            str(port),
            "--enable-memory-saver",
            "--enable-metrics",  # without it SGLang serves no /metrics and its activity is unobservable
            *extra,
        ],
        "/health",
        True,
        ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_requests_total"),
        health_timeout_s=SGLANG_HEALTH_TIMEOUT_S,
        boot_timeout_s=SGLANG_BOOT_TIMEOUT_S,
        boot_timeout_from="SGLang's startup limits: 120 s for its server, 600 s for its warmup",
    )
