import pytest

from turnout.core.runtime import (
    ActivateRequest,
    InvalidRequest,
    NoCapacity,
    backoff_s,
    engine_args,
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
