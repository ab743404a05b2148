"""Claim args judged in every spelling the engine takes (turnout.core.engine_args): each row is one spelling.

The spellings follow the engines' parsers: vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py:
underscores to dashes, ``=value``) over argparse with the short forms of vllm/engine/arg_utils.py and unambiguous
prefixes; SGLang's plain argparse (python/sglang/srt/server_args.py: ``--tp-size`` / ``--tensor-parallel-size``...,
prefixes such as ``--tp`` and ``--dp``); llama.cpp's common/arg.cpp (underscores to dashes in ``--`` flags, exact
names and short forms only).
"""

from __future__ import annotations

import pytest

from turnout.core.claims import InvalidClaim, parse_claim_spec
from turnout.core.engine_args import InvalidEngineArgs, flag_names, judge_engine_args, schedules_by_priority
from turnout.core.priority import Ordering
from turnout.core.runtime import ActivateRequest, InvalidRequest, sleeps_in_place

BASE = {"podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": "hf://org/m"}


@pytest.mark.parametrize(
    ("engine", "args", "fragment"),
    [
        # --gpu-memory-utilization: refused in every spelling
        ("vllm", {"--gpu-memory-utilization": "0.5"}, "not allowed"),
        ("vllm", {"--gpu_memory_utilization": "0.5"}, "not allowed"),
        ("vllm", {"--gpu-memory-utilization=0.5": ""}, "not allowed"),
        ("vllm", {"--gpu_memory_utilization=0.5": ""}, "not allowed"),
        ("vllm", {"--gpu-memory": "0.5"}, "not allowed"),  # argparse's abbreviation
        ("vllm", {"--gpu_memory_util": "0.5"}, "not allowed"),
        ("sglang", {"--gpu-memory-utilization": "0.5"}, "not allowed"),
        ("sglang", {"--gpu-memory-utilization=0.5": ""}, "not allowed"),
        ("llamacpp", {"--gpu-memory-utilization": "0.5"}, "not allowed"),
        ("llamacpp", {"--gpu_memory_utilization": "0.5"}, "not allowed"),
        # data parallel size: 1, in every spelling
        ("vllm", {"--data-parallel-size": "2"}, "data parallel size must be 1"),
        ("vllm", {"--data_parallel_size": "2"}, "data parallel size must be 1"),
        ("vllm", {"--data-parallel-size=2": ""}, "data parallel size must be 1"),
        ("vllm", {"-dp": "2"}, "data parallel size must be 1"),
        ("vllm", {"-dp=2": ""}, "data parallel size must be 1"),
        ("vllm", {"--data-parallel-size-local": "2"}, "data parallel size must be 1"),
        ("vllm", {"-dpl": "2"}, "data parallel size must be 1"),
        ("vllm", {"--data-parallel-s": "2"}, "cannot resolve"),  # size or size-local: vLLM refuses it too
        ("vllm", {"--data-parallel": "1"}, "cannot resolve"),
        ("vllm", {"-dp": "two"}, "must be an integer"),
        ("sglang", {"--dp-size": "2"}, "data parallel size must be 1"),
        ("sglang", {"--data-parallel-size": "2"}, "data parallel size must be 1"),
        ("sglang", {"--dp": "2"}, "data parallel size must be 1"),
        ("sglang", {"--dp=2": ""}, "data parallel size must be 1"),
        ("sglang", {"--dp_size": "2"}, "SGLang reads dashes only: write --dp-size"),
        ("sglang", {"--data_parallel_size": "1"}, "SGLang reads dashes only: write --dp-size"),
        # parallel sizes are whole numbers from 1
        ("vllm", {"--tensor-parallel-size": "two"}, "must be an integer"),
        ("vllm", {"--tensor_parallel_size": "0"}, "at least 1"),
        ("vllm", {"-tp": "-1"}, "at least 1"),
        ("vllm", {"-pp": "x"}, "must be an integer"),
        ("sglang", {"--tp": "x"}, "must be an integer"),
        ("sglang", {"--pp": "2"}, "cannot resolve"),  # --pp-size or --pp-max-micro-batch-size...
        ("sglang", {"--tp_size": "2"}, "SGLang reads dashes only: write --tp-size"),
        # one flag, two spellings: argparse would take the last one silently
        ("vllm", {"-tp": "2", "--tensor-parallel-size": "4"}, "same vLLM flag"),
        ("vllm", {"--tensor_parallel_size": "2", "--tensor-parallel-size=2": ""}, "same vLLM flag"),
        ("sglang", {"--tp": "2", "--tp-size": "2"}, "same SGLang flag"),
        # a value given twice
        ("vllm", {"--tensor-parallel-size=2": "2"}, "carries its value and has another"),
        # what Turnout writes itself, and what would hide flags from this judgement
        ("vllm", {"--port": "9000"}, "set by Turnout"),
        ("vllm", {"--served_model_name": "x"}, "set by Turnout"),
        ("vllm", {"--model=org/other": ""}, "set by Turnout"),
        ("vllm", {"--config": "engine.yaml"}, "config file"),
        ("sglang", {"--model-path": "org/other"}, "set by Turnout"),
        ("sglang", {"--host": "0.0.0.0"}, "set by Turnout"),
        ("sglang", {"--config": "engine.yaml"}, "config file"),
        ("llamacpp", {"--port": "9000"}, "set by Turnout"),
        ("llamacpp", {"-m": "/other.gguf"}, "set by Turnout"),
        ("llamacpp", {"--alias": "x"}, "set by Turnout"),
        ("llamacpp", {"--host": "0.0.0.0"}, "set by Turnout"),
        # llama.cpp: only llama-server's flags, as it spells them, with values it reads
        ("llamacpp", {"--n_ctx": "256"}, "llama-cpp-python's name; llama-server's is --ctx-size"),
        ("llamacpp", {"--n_threads": "1"}, "llama-server's is --threads"),
        ("llamacpp", {"--ctx-size=256": ""}, "takes no --flag=value"),
        ("llamacpp", {"--ctx-size": "big"}, "takes a whole number"),
        ("llamacpp", {"-c": ""}, "needs a value"),
        ("llamacpp", {"--embedding": "true"}, "takes no value"),
        ("llamacpp", {"--parallel": "0"}, "number of slots"),
        ("llamacpp", {"--pooling": "max"}, "takes one of none, mean, cls, last, rank"),
        ("llamacpp", {"--mlock": ""}, "cannot take: xllamacpp's CommonParams has no field"),
        ("llamacpp", {"--no-mmap": ""}, "cannot take"),
        ("llamacpp", {"--override-kv": "a=int:1"}, "cannot take"),
        ("llamacpp", {"-hf": "org/model"}, "download the model there"),
        ("llamacpp", {"--log-file": "/tmp/x"}, "process-wide log setting"),
        ("llamacpp", {"--tensor-parallel-size": "2"}, "not a llama-server flag"),
        ("llamacpp", {"--ctx": "256"}, "not a llama-server flag"),  # llama.cpp takes no abbreviation
    ],
)
def test_refused_in_every_spelling(engine: str, args: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidEngineArgs, match=fragment):
        judge_engine_args(engine, args)
    with pytest.raises(InvalidClaim, match=fragment):  # the claim's validation is this judgement
        parse_claim_spec("c", {**BASE, "engine": engine, "engineConfig": {"args": args}})
    with pytest.raises(InvalidRequest, match=fragment):  # and so is the agent's activation
        ActivateRequest.parse(
            {"model_name": "m", "artifact_url": "hf://org/m", "engine": engine, "engine_config": {"args": args}}
        )


@pytest.mark.parametrize(
    ("engine", "args", "gpus"),
    [
        ("vllm", {}, 1),
        ("vllm", {"--tensor-parallel-size": "2"}, 2),
        ("vllm", {"--tensor_parallel_size": "2"}, 2),  # counted: it is vLLM's tensor parallel size
        ("vllm", {"--tensor-parallel-size=4": ""}, 4),
        ("vllm", {"-tp": "2", "-pp": "2"}, 4),
        ("vllm", {"-tp=2": "", "--pipeline_parallel_size=3": ""}, 6),
        ("vllm", {"--tensor-parallel": "8"}, 8),  # argparse's abbreviation of --tensor-parallel-size
        ("vllm", {"-dp": "1", "-tp": "2"}, 2),
        ("vllm", {"--max-model-len": "4096", "--no-enable-sleep-mode": ""}, 1),  # others pass through
        ("sglang", {"--tp-size": "2"}, 2),
        ("sglang", {"--tensor-parallel-size": "2"}, 2),
        ("sglang", {"--tp": "4"}, 4),
        ("sglang", {"--tp=2": "", "--pp-size": "2"}, 4),
        ("sglang", {"--pipeline-parallel-size": "3"}, 3),
        ("sglang", {"--dp": "1", "--mem-fraction-static": "0.8"}, 1),
        ("llamacpp", {"--ctx-size": "8192", "-np": "2", "--threads": "1"}, 1),
        ("llamacpp", {"--ctx_size": "8192", "--n_gpu_layers": "99", "--embedding": "", "--pooling": "mean"}, 1),
    ],
)
def test_taken_and_counted(engine: str, args: dict[str, str], gpus: int) -> None:
    assert judge_engine_args(engine, args).gpus == gpus
    claim = parse_claim_spec("c", {**BASE, "engine": engine, "engineConfig": {"args": args}})
    assert claim.parallel_gpus == gpus  # what a pool pod must have


@pytest.mark.parametrize(
    ("args", "in_place"),
    [
        ({}, True),
        ({"--no-enable-sleep-mode": ""}, False),
        ({"--no_enable_sleep_mode": ""}, False),  # vLLM reads it the same
        ({"--enable-sleep-mode": ""}, True),
    ],
)
def test_vllm_sleep_mode_in_any_spelling(args: dict[str, str], in_place: bool) -> None:
    assert sleeps_in_place("vllm", args) is in_place


def test_names_of_args_judged_before_are_read_without_judging_values_again() -> None:
    assert flag_names("vllm", {"-tp=2": "", "--no_enable_sleep_mode": "", "--x": ""}) == {
        "--tensor-parallel-size",
        "--no-enable-sleep-mode",
    }
    assert flag_names("llamacpp", {"--anything": ""}) == frozenset()


LOW, HIGH = Ordering.LOW_FIRST, Ordering.HIGH_FIRST


@pytest.mark.parametrize(
    ("engine", "args", "expected"),
    [
        ("vllm", {"--scheduling-policy": "priority"}, LOW),
        ("vllm", {"--scheduling_policy": "priority"}, LOW),  # FlexibleArgumentParser: underscores to dashes
        ("vllm", {"--scheduling-policy=priority": ""}, LOW),
        ("vllm", {"--scheduling_policy=priority": ""}, LOW),
        ("vllm", {"--scheduling-pol": "priority"}, LOW),  # argparse's unambiguous prefix
        ("vllm", {"--scheduli": "priority"}, LOW),
        ("vllm", {"--scheduling-policy": "fcfs"}, None),
        ("vllm", {}, None),  # vLLM's default: fcfs
        ("vllm", {"--max-num-seqs": "8", "-tp": "1"}, None),
        ("vllm", {"--scheduler-cls": "x.Y"}, None),  # a neighbour, not the policy
        ("vllm", {"--schedul": "priority"}, None),  # ambiguous: vLLM refuses it, so nothing is sent
        ("vllm", {"--scheduling-policy": "Priority"}, None),  # not one of its choices: refused
        ("vllm", {"--enable-priority-scheduling": ""}, None),  # SGLang's switch: not a vLLM flag a rule knows
        # SGLang (server_args.py): "higher priority integer values will be scheduled first by default"
        ("sglang", {"--enable-priority-scheduling": ""}, HIGH),
        ("sglang", {"--enable-priority-sched": ""}, HIGH),  # argparse's unambiguous prefix
        ("sglang", {"--enable-priority-scheduling": "", "--schedule-low-priority-values-first": ""}, LOW),
        ("sglang", {"--enable-priority-scheduling": "", "--schedule-low": ""}, LOW),
        ("sglang", {"--schedule-low-priority-values-first": ""}, None),  # "if specified with" the switch only
        ("sglang", {"--enable_priority_scheduling": ""}, None),  # SGLang reads dashes only: refused
        ("sglang", {"--enable-priority-scheduling": "true"}, None),  # a switch takes no value: refused
        ("sglang", {"--schedule-policy": "priority"}, None),  # its queue policy (lpm, fcfs...), not priority
        ("sglang", {"--schedule": "lpm"}, None),  # ambiguous: SGLang refuses it
        ("llamacpp", {}, None),
    ],
)
def test_an_engine_started_with_the_priority_policy_in_any_spelling(
    engine: str, args: dict[str, str], expected: Ordering | None
) -> None:
    assert schedules_by_priority(engine, args) is expected


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"--scheduling-policy": "Priority"}, "--scheduling-policy must be fcfs or priority, got 'Priority'"),
        ({"--scheduling_policy": "lifo"}, "(vLLM's --scheduling-policy) must be fcfs or priority"),
        ({"--scheduling-policy": ""}, "must be fcfs or priority"),
        ({"--schedul": "priority"}, "cannot resolve"),  # --scheduler-cls, --scheduler-reserve-full-isl or this
    ],
)
def test_a_policy_vllm_would_refuse_is_refused_with_the_claim(args: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidEngineArgs) as caught:
        judge_engine_args("vllm", args)
    assert fragment in str(caught.value)
    with pytest.raises(InvalidClaim):
        parse_claim_spec("c", {**BASE, "engine": "vllm", "engineConfig": {"args": args}})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({**BASE, "engine": "vllm", "engineConfig": {"args": {"--scheduling-policy": "priority"}}}, LOW),
        ({**BASE, "engineConfig": {"args": {"--scheduling-policy": "priority"}}}, LOW),  # vllm: the default engine
        ({**BASE, "engine": "vllm", "engineConfig": {"args": {"--scheduling-policy": None}}}, None),  # "" : refused
        ({**BASE, "engine": "vllm"}, None),
        ({**BASE, "engine": "sglang", "engineConfig": {"args": {"--tp-size": "1"}}}, None),
        ({**BASE, "engine": "sglang", "engineConfig": {"args": {"--enable-priority-scheduling": None}}}, HIGH),
        ({"engine": "vllm", "engineConfig": {"args": {"--scheduling-policy": "priority"}}}, None),  # not a claim
        ("not a spec", None),
    ],
)
def test_a_claims_engine_schedules_by_priority(spec: object, expected: Ordering | None) -> None:
    from turnout.core.claims import schedules_by_priority as claim_schedules

    assert claim_schedules("c", spec) is expected
