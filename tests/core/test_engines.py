from typing import Any

import pytest

from turnout.core.engines import family_of, queue_gauges, read_gauges, slots_from_props
from turnout.core.parallelism import Parallelism, Source


@pytest.mark.parametrize(
    ("models", "family"),
    [
        # llama.cpp's server (tools/server: its /v1/models lists owned_by "llamacpp", with "meta")
        ([{"id": "smol", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}], "llamacpp"),
        ([{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "max_model_len": 4096}], "vllm"),
        ([{"id": "qwen", "object": "model", "owned_by": "sglang"}], "sglang"),
        ([{"id": "m", "object": "model", "owned_by": "me"}], None),  # llama-cpp-python's server
        ([{"id": "m", "object": "model", "owned_by": "library"}], None),  # Ollama's /v1
        ([{"id": "m", "object": "model", "owned_by": "organization_owner"}], None),  # LM Studio
        ([{"id": "a", "owned_by": "vllm"}, {"id": "b", "owned_by": "me"}], None),  # a proxy mixing servers
        ([{"id": "m"}], None),
        ([{"id": "m", "owned_by": ["vllm"]}], None),
        ([], None),
    ],
)
def test_family_of(models: list[dict[str, Any]], family: str | None) -> None:
    assert family_of(models) == family


@pytest.mark.parametrize(
    ("props", "slots"),
    [
        ({"total_slots": 4, "model_alias": "smol"}, 4),
        ({"total_slots": 1}, 1),
        ({"total_slots": 0}, None),
        ({"total_slots": True}, None),
        ({"total_slots": "4"}, None),
        ({}, None),
        ([], None),
        (None, None),
    ],
)
def test_slots_from_props(props: Any, slots: int | None) -> None:
    assert slots_from_props(props) == slots


def test_queue_gauges_read_each_engines_names_summed_over_models() -> None:
    vllm = [
        ("vllm:num_requests_running", 3.0),
        ("vllm:num_requests_running", 2.0),  # a second model_name label
        ("vllm:num_requests_waiting", 1.0),
        ("vllm:gpu_cache_usage_perc", 0.4),
    ]
    assert queue_gauges(vllm) == (5, 1)
    assert queue_gauges([("sglang:num_running_reqs", 7.0), ("sglang:num_queue_reqs", 0.0)]) == (7, 0)
    assert queue_gauges([("llamacpp:requests_processing", 2.0), ("llamacpp:requests_deferred", 3.0)]) == (2, 3)
    assert queue_gauges([("process_cpu_seconds_total", 1.0)]) == (None, None)


def test_a_shown_capacity_is_kept_and_raised_not_lowered() -> None:
    first = read_gauges("vllm", None, 4, 0, 4)
    assert first.slots is None and first.source is Source.ENGINE and "seen running 4" in first.why
    full = read_gauges("vllm", first, 16, 3, 16)
    assert full.slots == 16 and "16 running while 3 waited" in full.why
    assert read_gauges("vllm", full, 2, 0, 16) is full  # a quiet moment lowers nothing
    assert read_gauges("vllm", full, 10, 5, 16) is full  # nor a fuller cache with fewer running
    assert read_gauges("vllm", full, 20, 1, 20).slots == 20
    declared = Parallelism(4, Source.DECLARED, "x")
    assert read_gauges("sglang", declared, 6, 1, 6).slots == 6  # only what the engine showed is kept
