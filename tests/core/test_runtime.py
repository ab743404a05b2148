import pytest

from turnout.core.runtime import (
    ActivateRequest,
    InvalidRequest,
    NoCapacity,
    backoff_s,
    engine_args,
    gpu_neighbours,
    gpu_sharing_refusal,
    ipc_name,
    pick_port,
)

OK = {"model_name": "m", "artifact_url": "file:///models/m.gguf", "engine": "llamacpp"}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "JSON object"),
        ({**OK, "model_name": ""}, "model_name is required"),
        ({**OK, "artifact_url": "ftp://x"}, "artifact_url must start"),
        ({**OK, "engine": "tgi"}, "engine must be one of"),
        ({**OK, "port": -1}, "port must be"),
        ({**OK, "engine_config": {"args": {"--x": 1}}}, "map of strings"),
        ({**OK, "engine_config": {"args": {"--gpu-memory-utilization": "0.9"}}}, "shares GPU memory"),
        ({**OK, "engine_config": {"args": {"--gpu_memory_utilization=0.9": ""}}}, "shares GPU memory"),
        ({**OK, "extra": 1}, "unknown field"),
    ],
)
def test_invalid(body: object, fragment: str) -> None:
    with pytest.raises(InvalidRequest, match=fragment):
        ActivateRequest.parse(body)


def test_parse_defaults() -> None:
    req = ActivateRequest.parse({**OK, "engine_config": {"args": {"--ctx-size": "512", "--verbose": ""}}})
    assert req.port == 0 and req.args == {"--ctx-size": "512", "--verbose": ""}


@pytest.mark.parametrize(
    ("wanted", "model", "taken", "expected"),
    [
        ("", "llama3", [], "kv_llama3"),
        ("a b/c:d", "m", [], "a_b_c_d"),
        ("x" * 80, "m", [], "x" * 64),
        ("kv", "m", ["kv"], "kv_1"),
        ("kv", "m", ["kv", "kv_1"], "kv_2"),
        ("x" * 64, "m", ["x" * 64], "x" * 62 + "_1"),
        ("", "org/Model:8b", [], "kv_org_Model_8b"),
    ],
)
def test_ipc_name(wanted: str, model: str, taken: list[str], expected: str) -> None:
    name = ipc_name(wanted, model, taken)
    assert name == expected and len(name) <= 64


def test_ports() -> None:
    assert pick_port(0, 9000, 9002, [9000]) == 9001
    assert pick_port(9100, 9000, 9002, []) == 9100
    with pytest.raises(NoCapacity, match="already used"):  # capacity, not an invalid request: 409, retried
        pick_port(9001, 9000, 9002, [9001])
    with pytest.raises(NoCapacity, match="no free port"):
        pick_port(0, 9000, 9001, [9000, 9001])


@pytest.mark.parametrize(("n", "delay"), [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (10, 60)])
def test_backoff(n: int, delay: float) -> None:
    assert backoff_s(n) == delay


def test_engine_args() -> None:
    assert engine_args({"--enable-x": "", "--tp": "2"}) == ["--enable-x", "--tp", "2"]


@pytest.mark.parametrize(
    ("engine", "others", "gpus", "neighbours"),
    [
        ("vllm", [("a", "vllm", "active")], 1, [("a", "vllm")]),
        ("vllm", [("a", "sglang", "sleeping"), ("b", "vllm", "booting")], 2, [("a", "sglang"), ("b", "vllm")]),
        ("sglang", [("a", "vllm", "restarting")], 1, [("a", "vllm")]),
        ("vllm", [("a", "vllm", "failed")], 1, []),  # a failed engine holds nothing
        ("vllm", [("a", "llamacpp", "active")], 1, []),  # kvcached does not concern llama.cpp
        ("llamacpp", [("a", "vllm", "active")], 1, []),
        ("vllm", [("a", "vllm", "active")], 0, []),  # no GPU: nothing to share (vLLM on CPU)
        ("vllm", [], 1, []),  # the first engine
    ],
)
def test_gpu_neighbours(
    engine: str, others: list[tuple[str, str, str]], gpus: int, neighbours: list[tuple[str, str]]
) -> None:
    assert gpu_neighbours(engine, others, gpus) == neighbours


@pytest.mark.parametrize(
    ("neighbours", "gpus", "missing", "fragments"),
    [
        ([("a", "vllm")], 1, [], None),  # every interpreter has kvcached: it may start
        ([], 1, ["/usr/bin/python3"], None),  # nothing beside it
        (
            [("a", "vllm")],
            1,
            ["/usr/bin/python3"],
            ["second engine on this pod's GPU (beside a)", "cannot be imported by /usr/bin/python3", "kvcached"],
        ),
        (
            [("b", "sglang"), ("a", "vllm")],
            8,
            ["/opt/sgl/bin/python", "/opt/vllm/bin/python", "/opt/vllm/bin/python"],
            ["this pod's 8 GPUs (beside a, b)", "/opt/sgl/bin/python or /opt/vllm/bin/python", "ovg-project"],
        ),
    ],
)
def test_gpu_sharing_refusal(
    neighbours: list[tuple[str, str]], gpus: int, missing: list[str], fragments: list[str] | None
) -> None:
    why = gpu_sharing_refusal("m", neighbours, gpus, missing)
    if fragments is None:
        assert why is None
    else:
        assert why is not None and why.startswith("not started: m would be a second engine")
        for fragment in fragments:
            assert fragment in why, why
