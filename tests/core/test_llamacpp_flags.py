"""llama-server's flags as Turnout's llama.cpp engine reads them (turnout.core.llamacpp_flags), one spelling a row.

Names and readings follow llama.cpp's common/arg.cpp (common_params_parser_init, common_params_parse_ex).
"""

from __future__ import annotations

from typing import Any

import pytest

from turnout.core.llamacpp_flags import (
    FLAGS,
    MANAGED,
    UNREACHABLE,
    EnumValue,
    InvalidLlamaArgs,
    llama_name,
    parse_argv,
    settings,
)


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--ctx-size", "8192"], "n_ctx", 8192),
        (["-c", "8192"], "n_ctx", 8192),
        (["--ctx_size", "8192"], "n_ctx", 8192),  # llama.cpp turns a -- flag's underscores into dashes
        (["--parallel", "4"], "n_parallel", 4),
        (["-np", "2"], "n_parallel", 2),
        (["-np", "-1"], "n_parallel", -1),  # llama-server's automatic slots
        (["--threads", "1"], "cpuparams.n_threads", 1),
        (["-t", "2"], "cpuparams.n_threads", 2),
        (["--threads-batch", "3"], "cpuparams_batch.n_threads", 3),
        (["-tb", "3"], "cpuparams_batch.n_threads", 3),
        (["--threads_batch", "3"], "cpuparams_batch.n_threads", 3),
        (["--embedding"], "embedding", True),
        (["--embeddings"], "embedding", True),
        (["--alias", "a, b,"], "model_alias", {"a", "b"}),
        (["-a", "a"], "model_alias", {"a"}),
        (["--port", "8080"], "port", 8080),
        (["--host", "0.0.0.0"], "hostnames", ["0.0.0.0"]),
        (["-m", "/m.gguf"], "model.path", "/m.gguf"),
        (["--model", "/m.gguf"], "model.path", "/m.gguf"),
        (["--metrics"], "endpoint_metrics", True),
        (["--props"], "endpoint_props", True),
        (["--slots"], "endpoint_slots", True),
        (["--no-slots"], "endpoint_slots", False),
        (["--no_slots"], "endpoint_slots", False),
        (["-cb"], "cont_batching", True),
        (["-nocb"], "cont_batching", False),
        (["--no-cont-batching"], "cont_batching", False),
        (["-kvu"], "kv_unified", True),
        (["-no-kvu"], "kv_unified", False),
        (["--kv-offload"], "no_kv_offload", False),  # the field says the opposite
        (["-nkvo"], "no_kv_offload", True),
        (["--no-mmproj"], "no_mmproj", True),
        (["--cache-ram", "256"], "cache_ram_mib", 256),
        (["-cram", "-1"], "cache_ram_mib", -1),
        (["--no-cache-prompt"], "cache_prompt", False),
        (["--cache-reuse", "256"], "n_cache_reuse", 256),
        (["--pooling", "mean"], "pooling_type", EnumValue("llama_pooling_type", "LLAMA_POOLING_TYPE_MEAN")),
        (["--rerank"], "pooling_type", EnumValue("llama_pooling_type", "LLAMA_POOLING_TYPE_RANK")),
        (["-fa", "on"], "flash_attn_type", EnumValue("llama_flash_attn_type", "LLAMA_FLASH_ATTN_TYPE_ENABLED")),
        (["-fa", "0"], "flash_attn_type", EnumValue("llama_flash_attn_type", "LLAMA_FLASH_ATTN_TYPE_DISABLED")),
        (["--flash-attn", "auto"], "flash_attn_type", EnumValue("llama_flash_attn_type", "LLAMA_FLASH_ATTN_TYPE_AUTO")),
        (["-ctk", "q8_0"], "cache_type_k", EnumValue("ggml_type", "GGML_TYPE_Q8_0")),
        (["-ngl", "99"], "n_gpu_layers", 99),
        (["--gpu-layers", "all"], "n_gpu_layers", -2),
        (["--n-gpu-layers", "auto"], "n_gpu_layers", -1),
        (["--n_gpu_layers", "12"], "n_gpu_layers", 12),
        (["--fit", "off"], "fit_params", False),
        (["--timeout", "30"], "timeout_write", 30),
        (["-to", "30"], "timeout_read", 30),
        (["--api-key", "k1,k2"], "api_keys", ["k1", "k2"]),
        (["--jinja"], "use_jinja", True),
        (["--no-jinja"], "use_jinja", False),
        (
            ["--reasoning-format", "deepseek-legacy"],
            "reasoning_format",
            EnumValue("common_reasoning_format", "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY"),
        ),
        (["-rea", "off"], "enable_reasoning", 0),
        (["--reasoning", "auto"], "enable_reasoning", -1),
        (["--temp", "0"], "sampling.temp", 0.0),
        (["--temperature", "0.5"], "sampling.temp", 0.5),
        (["--top-k", "1"], "sampling.top_k", 1),
        (["-s", "42"], "sampling.seed", 42),
        (["--sleep-idle-seconds", "60"], "sleep_idle_seconds", 60),
        (["--lora", "a.gguf,b.gguf"], "lora_adapters", [("a.gguf", 1.0), ("b.gguf", 1.0)]),
        (["--lora-scaled", "a.gguf:0.5"], "lora_adapters", [("a.gguf", 0.5)]),
        (["-v"], "verbosity", 2**31 - 1),
        (["-lv", "1"], "verbosity", 1),
    ],
)
def test_each_spelling_sets_its_field(argv: list[str], field: str, value: Any) -> None:
    assert parse_argv(argv).value(field) == value


def test_later_flags_win_as_in_llama_cpp() -> None:
    read = parse_argv(["--ctx-size", "512", "--threads", "1", "-c", "8192", "-t", "2"])
    assert read.value("n_ctx") == 8192 and read.value("cpuparams.n_threads") == 2


def test_a_switch_takes_no_value_from_the_next_argument() -> None:
    """``--verbose`` and ``--rerank`` are switches: the flag after them is a flag."""
    read = parse_argv(["--verbose", "--chat-template-file", "/t.jinja", "--rerank", "--embd-normalize", "2"])
    assert read.files == (("chat_template", "/t.jinja"),) and read.value("embd_normalize") == 2
    assert read.value("embedding") is True and "--verbose" in read.flags


def test_sampling_flags_mark_what_the_user_set() -> None:
    """common/arg.cpp ORs a bit into user_sampling_config for each (the model's own defaults keep the rest)."""
    read = parse_argv(["--temp", "0.2", "--top-p", "0.9"])
    bits = [v for f, v in read.assignments if f == "sampling.user_sampling_config"]
    assert [b.member for b in bits] == ["COMMON_PARAMS_SAMPLING_CONFIG_TEMP", "COMMON_PARAMS_SAMPLING_CONFIG_TOP_P"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--ctx-size"], "needs a value"),
        (["--ctx-size", "x"], "takes a whole number"),
        (["--ctx-size", "-5"], "at least 0"),
        (["--ctx-size=8192"], "takes no --flag=value"),
        (["--parallel", "0"], "number of slots"),
        (["--sleep-idle-seconds", "0"], "at least 1, or -1"),
        (["--pooling", "MEAN"], "takes one of"),
        (["-fa", "maybe"], "on, off or auto"),
        (["--fit", "auto"], "on or off"),
        (["--temp", "warm"], "takes a number"),
        (["--lora-scaled", "a.gguf"], "FILE:SCALE"),
        (["--mlock"], "cannot take"),
        (["-dev", "CUDA0"], "cannot take"),
        (["--rpc", "h:1"], "RPC backends"),
        (["--models-dir", "/m"], "router mode"),
        (["--n_ctx", "1"], "llama-server's is --ctx-size"),
        (["--interrupt_requests", "false"], "never interrupts a stream"),
        (["--kv_overrides", "x"], "--pooling mean"),
        (["--no-such-flag"], "not a llama-server flag Turnout's llama.cpp engine takes; it takes --ctx-size"),
        (["-C", "ff"], "not a llama-server flag"),  # llama-server has it; not mapped (named in the message)
        (["ctx-size", "1"], "not a llama-server flag"),
    ],
)
def test_refused_with_what_to_change(argv: list[str], fragment: str) -> None:
    with pytest.raises(InvalidLlamaArgs, match=fragment):
        parse_argv(argv)


def test_a_claim_may_not_set_what_turnout_writes() -> None:
    for name in MANAGED:
        with pytest.raises(InvalidLlamaArgs, match="set by Turnout"):
            settings([(name, "x")], claim=True)
    assert settings([("--port", "8080")]).value("port") == 8080  # the engine's own command line has them


def test_the_table_is_consistent() -> None:
    """No spelling names two flags, none is also refused, every name is as llama.cpp would look it up."""
    spellings = [n for f in FLAGS for n in (*f.names, *f.negatives)]
    assert len(spellings) == len(set(spellings))
    assert not set(spellings) & set(UNREACHABLE)
    assert all(llama_name(n) == n for n in [*spellings, *UNREACHABLE])
    assert set(MANAGED) <= {f.name for f in FLAGS}
