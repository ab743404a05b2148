"""Engine command lines as the agent spawns them (the vLLM and llama.cpp ones also run for real elsewhere)."""

from __future__ import annotations

import sys

import pytest

from turnout.runtime.launch import artifact_path, launch_command


def test_vllm_command_and_sleep_mode() -> None:
    launch = launch_command("vllm", "qwen", "hf://Qwen/Qwen3-0.6B", 30001, {"--max-model-len": "4096"})
    assert launch.argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert launch.argv[launch.argv.index("--model") + 1] == "Qwen/Qwen3-0.6B"
    assert launch.argv[launch.argv.index("--served-model-name") + 1] == "qwen"
    assert "--enable-sleep-mode" in launch.argv and launch.argv[-2:] == ["--max-model-len", "4096"]
    assert launch.sleep_api and launch.health_path == "/health" and launch.sleep_state_path == "/is_sleeping"
    # a platform without sleep mode (CPU): the claim's flag comes last and wins; the agent then stops the process
    off = launch_command("vllm", "qwen", "hf://Qwen/Qwen3-0.6B", 30001, {"--no-enable-sleep-mode": ""})
    assert off.argv[-1] == "--no-enable-sleep-mode" and not off.sleep_api and off.sleep_state_path is None


def test_sglang_serves_metrics_and_gets_time_for_its_generating_health_check() -> None:
    launch = launch_command("sglang", "m", "hf://org/m", 30003, {})
    assert "--enable-metrics" in launch.argv  # SGLang has no /metrics without it
    assert launch.health_timeout_s > 20  # its /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s)


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "10.1.2.3"])
def test_engines_listen_where_the_agent_listens(engine: str, host: str) -> None:
    argv = launch_command(engine, "m", "file:///m.gguf", 30004, {}, host=host).argv
    assert argv[argv.index("--host") + 1] == host


@pytest.mark.parametrize(
    ("engine", "module", "sleeps_in_place"),
    [("sglang", "sglang.launch_server", True), ("llamacpp", "turnout.runtime.llamacpp_server", False)],
)
def test_other_engines(engine: str, module: str, sleeps_in_place: bool) -> None:
    launch = launch_command(engine, "m", "file:///models/m.gguf", 30002, {}, python="/opt/engines/bin/python")
    assert launch.argv[:3] == ["/opt/engines/bin/python", "-m", module]  # the interpreter that has the engine
    assert "/models/m.gguf" in launch.argv and launch.sleep_api is sleeps_in_place


def test_llama_cpp_is_its_own_server_with_llama_servers_flags() -> None:
    """llama.cpp's server from the xllamacpp wheel, told llama-server's flags (the claim's args after Turnout's
    own), ready when its /health says so (503 while the model loads)."""
    launch = launch_command("llamacpp", "smol", "file:///m.gguf", 20001, {"--ctx-size": "8192", "--embedding": ""})
    assert launch.argv[1:] == [
        "-m",
        "turnout.runtime.llamacpp_server",
        "--model",
        "/m.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "20001",
        "--alias",
        "smol",
        "--ctx-size",
        "8192",
        "--embedding",
    ]
    assert launch.health_path == "/health" and not launch.sleep_api and launch.activity is None


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("hf://org/m", "org/m"),
        ("huggingface://org/m", "org/m"),
        ("file:///x/m.gguf", "/x/m.gguf"),
        ("s3://b/m", "s3://b/m"),
    ],
)
def test_artifact_path(url: str, path: str) -> None:
    assert artifact_path(url) == path


def test_each_engine_boots_within_its_own_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline for an engine to answer its health check is the engine's own boot timeout: vLLM's
    VLLM_ENGINE_READY_TIMEOUT_S as the engine reads it from the environment it inherits (600 s by default),
    SGLang's 120 s for its own server plus 600 s for its warmup, 600 s for llama.cpp (which has none)."""
    monkeypatch.delenv("VLLM_ENGINE_READY_TIMEOUT_S", raising=False)
    assert launch_command("vllm", "m", "hf://org/m", 30001, {}).boot_timeout_s == 600
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "1800")
    vllm = launch_command("vllm", "m", "hf://org/m", 30001, {})
    assert vllm.boot_timeout_s == 1800 and "VLLM_ENGINE_READY_TIMEOUT_S" in vllm.boot_timeout_from
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "not a number")  # vLLM itself would not start: the default
    assert launch_command("vllm", "m", "hf://org/m", 30001, {}).boot_timeout_s == 600
    assert launch_command("sglang", "m", "hf://org/m", 30001, {}).boot_timeout_s == 720
    assert launch_command("llamacpp", "m", "file:///m.gguf", 30001, {}).boot_timeout_s == 600
