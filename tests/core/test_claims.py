import pytest

from turnout.core.claims import (
    POOL_LABEL,
    InvalidClaim,
    PodView,
    artifact_key,
    candidates,
    parse_claim_spec,
    rank_pods,
)

BASE = {"podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": "hf://org/m"}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"artifactURL": "hf://x"}, "podSelector is required"),
        ({**BASE, "podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "In needs at least one"),
        ({"podSelector": {"matchLabels": {"pool": "a"}}}, "artifactURL is required"),
        ({**BASE, "engine": "tgi"}, "engine must be one of"),
        ({**BASE, "replicas": 2}, "replicas must be 1"),
        ({**BASE, "engineConfig": {"args": {"--gpu-memory-utilization": "0.9"}}}, "not allowed"),
        ({**BASE, "engineConfig": {"args": {"--data-parallel-size": "2"}}}, "data parallel size must be 1"),
        ({**BASE, "engineConfig": {"args": {"--tensor-parallel-size": "two"}}}, "must be an integer"),
        ({**BASE, "engineConfig": {"args": {"--tensor-parallel-size": 2}}}, "map of strings"),
        ([], "spec must be an object"),
    ],
)
def test_invalid_claims(spec: object, fragment: str) -> None:
    with pytest.raises(InvalidClaim, match=fragment):
        parse_claim_spec("c", spec)


def test_defaults_and_parallel_size() -> None:
    claim = parse_claim_spec(
        "qwen", {**BASE, "engineConfig": {"args": {"--tensor-parallel-size": "2", "--pipeline-parallel-size": "2"}}}
    )
    assert claim.model_name == "qwen" and claim.engine == "vllm" and claim.parallel_gpus == 4
    assert parse_claim_spec("c", {**BASE, "modelName": "m"}).model_name == "m"


def pod(name: str, **kw: object) -> PodView:
    base: dict[str, object] = {
        "labels": {"pool": "a", POOL_LABEL: "true"},
        "running": True,
        "address": "10.0.0.1",
        "gpus": 1,
    }
    base.update(kw)
    return PodView(name=name, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pods", "expected", "why"),
    [
        ([pod("p", labels={"pool": "b", POOL_LABEL: "true"})], [], "no pod matches"),
        ([pod("p", labels={"pool": "a"})], [], POOL_LABEL),
        ([pod("p", running=False)], [], "running with an address"),
        ([pod("p", address=None)], [], "running with an address"),
        ([pod("p", gpus=2)], [], "set them to match"),
        ([pod("a"), pod("b", cached_artifacts=frozenset({"hf://org/m"}))], ["b", "a"], ""),
        ([pod("a", free_hbm_bytes=1), pod("b", free_hbm_bytes=9)], ["b", "a"], ""),
        ([pod("a", kv_used_bytes=9), pod("b", kv_used_bytes=1)], ["b", "a"], ""),
        ([pod("a", models=3), pod("b", models=1)], ["b", "a"], ""),
        ([pod("a", load=0.9), pod("b", load=0.1)], ["b", "a"], ""),
        ([pod("b"), pod("a")], ["a", "b"], ""),
    ],
)
def test_rank(pods: list[PodView], expected: list[str], why: str) -> None:
    ranked, reason = rank_pods(parse_claim_spec("c", BASE), pods)
    assert [p.name for p in ranked] == expected
    assert why in reason


def test_cached_artifact_matches_either_hugging_face_scheme() -> None:
    """A pod that cached hf://org/m ranks first for a claim written huggingface://org/m."""
    claim = parse_claim_spec("c", {**BASE, "artifactURL": "huggingface://org/m"})
    ranked, _ = rank_pods(claim, [pod("a"), pod("b", cached_artifacts=frozenset({artifact_key("hf://org/m")}))])
    assert [p.name for p in ranked] == ["b", "a"]
    assert artifact_key("huggingface://org/m") == artifact_key("hf://org/m") == "hf://org/m"
    assert artifact_key("s3://bucket/m") == "s3://bucket/m"


def test_null_flag_value_is_a_boolean_flag() -> None:
    """Some API servers hand "" back as null; the claim still means a flag without a value."""
    claim = parse_claim_spec("c", {**BASE, "engineConfig": {"args": {"--enforce-eager": None}}})
    assert claim.args == {"--enforce-eager": ""}


def test_pod_selector_expressions_pick_pods() -> None:
    spec = {
        **BASE,
        "podSelector": {
            "matchLabels": {"pool": "a"},
            "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}],
        },
    }
    claim = parse_claim_spec("c", spec)
    h100 = pod("h100", labels={"pool": "a", POOL_LABEL: "true", "gpu": "h100"})
    t4 = pod("t4", labels={"pool": "a", POOL_LABEL: "true", "gpu": "t4"})
    ranked, _ = rank_pods(claim, [t4, h100])
    assert [p.name for p in ranked] == ["h100"] and candidates(claim, [t4, h100]) == 1
    assert candidates(claim, [t4]) == 0


def test_a_claims_engine_is_its_specs_or_none_for_a_spec_that_is_not_a_claim() -> None:
    from turnout.core.claims import claim_engine

    spec = {"modelName": "m", "podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": "hf://org/m"}
    assert claim_engine("c", spec) == "vllm"  # the default engine
    assert claim_engine("c", {**spec, "engine": "llamacpp"}) == "llamacpp"
    assert claim_engine("c", {**spec, "engine": "nope"}) is None
    assert claim_engine("c", None) is None
