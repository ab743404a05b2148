"""Configuration: the example validates, the schema in docs/ is current, errors name field paths."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from turnout.config import ConfigError, Settings, agent_env, config_schema, load_settings, settings_from_document

ROOT = Path(__file__).resolve().parents[1]


def test_example_config_is_valid() -> None:
    settings = load_settings(ROOT / "config.example.json", env={})
    assert [w.name for w in settings.workers] == ["node-1", "node-2", "gpu-llamacpp"]
    assert settings.placement_file == (ROOT / "turnout-data" / "model-placement.json").resolve()
    assert settings.workers[0].model_placement.rules().to_json()["mode"] == "whitelist"


def test_committed_schema_is_current() -> None:
    committed = json.loads((ROOT / "docs" / "config.schema.json").read_text())
    assert committed == config_schema(), "run: turnout config schema > docs/config.schema.json"


def test_example_validates_against_json_schema() -> None:
    jsonschema.validate(json.loads((ROOT / "config.example.json").read_text()), config_schema())


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("data", "fragments"),
    [
        (
            {"workers": [{"name": "a", "url": "http://x", "model_placement": {"allowed_models": ["ge*ma"]}}]},
            ["workers[0].model_placement.allowed_models", "last character"],
        ),
        ({"workers": [{"name": "a", "url": "ftp://x"}]}, ["workers[0].url", "URL scheme"]),
        ({"workers": [{"name": "a", "url": "http://x", "type": "vllm"}]}, ["workers[0].type", "'ollama' or 'openai'"]),
        ({"workers": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}, ["duplicate worker name"]),
        ({"workers": [{"name": "a b", "url": "http://x"}]}, ["workers[0].name"]),
        ({"workers": [{"name": "a", "url": "http://x", "max_concurrent": 0}]}, ["workers[0].max_concurrent"]),
        ({"routing": {"model_max_concurrent": {"q*x": 2}}}, ["routing.model_max_concurrent", "last character"]),
        ({"routing": {"queue_timeout_s": -1}}, ["routing.queue_timeout_s"]),
        ({"listen": {"port": 70000}}, ["listen.port"]),
        ({"lisen": {}}, ["lisen", "Extra inputs are not permitted"]),
        ({"workers": [{"name": "a"}]}, ["workers[0].url", "Field required"]),
        (
            {"pools": {"agents": [{"name": "g", "agent_url": "http://x"}], "kubernetes": {}}},
            ["pools", "not both"],
        ),
        ({"pools": {"kubernetes": {"namespace": ["a"]}}}, ["pools.kubernetes.namespace", "Extra inputs"]),
        (
            {"pools": {"agents": [{"name": "g", "agent_url": "http://x"}, {"name": "g", "agent_url": "http://y"}]}},
            ["duplicate pool agent name", "'g'"],
        ),
        ({"network": {"nat64_prefixes": ["64:ff9b:1:2a::/80"]}}, ["network.nat64_prefixes", "/32, /40"]),
        ({"network": {"nat64_prefixes": ["64:ff9b:1:2a::1/96"]}}, ["network.nat64_prefixes", "host bits set"]),
        ({"network": {"nat64_prefixes": ["64:ff9b:1:2a::"]}}, ["network.nat64_prefixes", "has no length"]),
        ({"network": {"nat64_prefix": "64:ff9b:1::/48"}}, ["network.nat64_prefix", "Extra inputs"]),
        ("[1, 2]", ["top level must be a JSON object"]),
        ('{"workers": [}', ["not valid JSON", "line 1"]),
    ],
)
def test_errors_name_the_field(tmp_path: Path, data: object, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, data), env={})
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "nope.json", env={})


def test_relative_paths_follow_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"storage": {"data_dir": "state", "model_placement_file": "/abs/p.json"}})
    settings = load_settings(path, env={"TURNOUT_ADMIN_TOKEN": "t0k"})
    assert settings.data_dir == tmp_path / "state"
    assert settings.placement_file == Path("/abs/p.json")
    assert settings.admin_token == "t0k"


APP, LEGACY = "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS", "APP_NOTIFY_ALLOW_PRIVATE_NETWORKS"


@pytest.mark.parametrize(
    ("env", "allow", "interval", "hints"),
    [
        ({}, False, 20.0, 0),
        ({"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}, True, 20.0, 0),
        ({"TURNOUT_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "1"}, True, 20.0, 0),
        ({"APP_NOTIFY_ALLOW_PRIVATE_NETWORKS": "true"}, True, 20.0, 1),
        ({"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "false"}, False, 20.0, 0),
        # an explicit specific setting wins over the legacy variable, whichever way it goes
        ({APP: "false", LEGACY: "true"}, False, 20.0, 1),
        ({"TURNOUT_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "0", LEGACY: "1"}, False, 20.0, 1),
        ({APP: "true", LEGACY: "false"}, True, 20.0, 1),
        ({APP: "yes", LEGACY: "on"}, True, 20.0, 0),
        ({APP: " ", LEGACY: "true"}, True, 20.0, 1),
        ({"APP_NOTIFY_ALLOW_PRIVATE_NETWORKS": "false"}, False, 20.0, 0),
        ({"APP_MODEL_ENDPOINT_HEALTH_INTERVAL": "0"}, False, 0.0, 0),
        ({"TURNOUT_MODEL_ENDPOINT_HEALTH_INTERVAL": "45"}, False, 45.0, 0),
    ],
)
def test_endpoint_environment(tmp_path: Path, env: dict[str, str], allow: bool, interval: float, hints: int) -> None:
    settings = load_settings(write(tmp_path, {}), env=env)
    assert settings.endpoint_env.allow_private is allow
    assert settings.endpoint_env.health_interval_s == interval
    assert len(settings.endpoint_env.hints) == hints


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "maybe"}, "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS='maybe'"),
        ({"APP_NOTIFY_ALLOW_PRIVATE_NETWORKS": "2"}, "APP_NOTIFY_ALLOW_PRIVATE_NETWORKS='2': must be true or false"),
        (
            {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true", "TURNOUT_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "0"},
            "disagree",
        ),
    ],
)
def test_bad_private_network_setting(tmp_path: Path, env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(write(tmp_path, {}), env=env)


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "NaN", "inf", "-inf", "1e999", "86401"])
def test_bad_health_interval(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="APP_MODEL_ENDPOINT_HEALTH_INTERVAL"):
        load_settings(write(tmp_path, {}), env={"APP_MODEL_ENDPOINT_HEALTH_INTERVAL": value})


W = {"name": "a", "url": "http://x"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # NaN and the infinities: JSON files may spell them NaN / Infinity, strings "nan" / "inf" / "1e999".
        ('{"routing": {"queue_timeout_s": NaN}}', "routing.queue_timeout_s"),
        ('{"routing": {"queue_timeout_s": Infinity}}', "routing.queue_timeout_s"),
        ('{"routing": {"queue_timeout_s": "nan"}}', "routing.queue_timeout_s"),
        ('{"health": {"interval_s": "inf"}}', "health.interval_s"),
        ('{"health": {"timeout_s": -Infinity}}', "health.timeout_s"),
        ('{"limits": {"upstream_timeout_s": "1e999"}}', "limits.upstream_timeout_s"),
        ('{"limits": {"connect_timeout_s": NaN}}', "limits.connect_timeout_s"),
        ('{"auth": {"rotate_grace_s": Infinity}}', "auth.rotate_grace_s"),
        ('{"auth": {"key_cache_s": "nan"}}', "auth.key_cache_s"),
        ('{"pools": {"interval_s": NaN}}', "pools.interval_s"),
    ],
)
def test_numbers_must_be_finite(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    assert where in str(info.value) and "finite" in str(info.value)


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"routing": {"max_concurrent": 2**63}}, "routing.max_concurrent"),
        ({"routing": {"model_max_concurrent": {"q:*": 10**7}}}, "routing.model_max_concurrent.q:*"),
        ({"routing": {"queue_timeout_s": 3601}}, "routing.queue_timeout_s"),
        ({"routing": {"max_queue": 10**9}}, "routing.max_queue"),
        ({"health": {"interval_s": 86_400}}, "health.interval_s"),
        ({"health": {"timeout_s": 301}}, "health.timeout_s"),
        ({"health": {"failures_to_down": 101}}, "health.failures_to_down"),
        ({"limits": {"max_body_bytes": 2**40}}, "limits.max_body_bytes"),
        ({"limits": {"upstream_timeout_s": 86_401}}, "limits.upstream_timeout_s"),
        ({"limits": {"connect_timeout_s": 1e9}}, "limits.connect_timeout_s"),
        ({"auth": {"rotate_grace_s": 1e12}}, "auth.rotate_grace_s"),
        ({"auth": {"key_cache_s": 86_400}}, "auth.key_cache_s"),
        ({"auth": {"default_completion_tokens": 2**31}}, "auth.default_completion_tokens"),
        ({"auth": {"open": "yes"}}, "auth.open"),
        ({"auth": {"open": 1}}, "auth.open"),
        ({"tenants": {"t": {"rpm": 2**31}}}, "tenants.t.rpm"),
        ({"tenants": {"t": {"daily_tokens": 2**63}}}, "tenants.t.daily_tokens"),
        ({"tenants": {"t": {"max_concurrent": 10**7}}}, "tenants.t.max_concurrent"),
        ({"workers": [{**W, "max_concurrent": 2**63}]}, "workers[0].max_concurrent"),
        ({"workers": [{**W, "api_key": "k\r\nX-Injected: 1"}]}, "workers[0].api_key"),
        ({"workers": [{**W, "api_key": "k" * 9000}]}, "workers[0].api_key"),
        ({"listen": {"host": ""}}, "listen.host"),
        ({"listen": {"host": "h" * 300}}, "listen.host"),
        ({"pools": {"agents": [{"name": "g", "agent_url": "http://x", "gpus": 10**6}]}}, "pools.agents[0].gpus"),
    ],
)
def test_bounds_name_the_field(tmp_path: Path, data: object, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, data), env={})
    assert where in str(info.value)


def test_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    data = {
        "routing": {"queue_timeout_s": 3600, "max_concurrent": 1_000_000},
        "limits": {"upstream_timeout_s": 86_400, "max_body_bytes": 1024**3},
        "auth": {"default_completion_tokens": 2**31 - 1, "open": False},
        "tenants": {"t": {"rpm": 2**31 - 1, "daily_tokens": 2**31 - 1}},
    }
    settings = load_settings(write(tmp_path, data), env={})
    assert settings.limits.upstream_timeout_s == 86_400 and settings.tenants["t"].rpm == 2**31 - 1


@pytest.mark.parametrize(
    ("env", "mock", "cache"),
    [
        ({}, False, None),
        ({"AIBRIX_MODEL_RUNTIME_MOCK": "1", "AIBRIX_WEIGHT_CACHE_DIR": "/models"}, True, Path("/models")),
        ({"AIBRIX_MODEL_RUNTIME_MOCK": "0", "AIBRIX_WEIGHT_CACHE_DIR": " "}, False, None),
        ({"AIBRIX_MODEL_RUNTIME_MOCK": "true"}, True, None),
    ],
)
def test_agent_environment(env: dict[str, str], mock: bool, cache: Path | None) -> None:
    settings = agent_env(env)
    assert settings.mock is mock and settings.weight_cache_dir == cache


def test_agent_environment_refuses_an_unclear_mock_switch() -> None:
    with pytest.raises(ConfigError, match="AIBRIX_MODEL_RUNTIME_MOCK='maybe': use 1"):
        agent_env({"AIBRIX_MODEL_RUNTIME_MOCK": "maybe"})


@pytest.mark.parametrize("field", ["url", "metrics_url"])
def test_a_worker_url_may_not_carry_a_password(tmp_path: Path, field: str) -> None:
    entry = {"name": "a", "url": "http://127.0.0.1:1", field: "http://user:pw@127.0.0.1:2"}
    with pytest.raises(ConfigError, match=rf"workers\[0\]\.{field}: .*user or password"):
        load_settings(write(tmp_path, {"workers": [entry]}), env={})


def test_a_tenants_priority_class_and_a_workers_priority_scheduling() -> None:
    """``tenants.<t>.priority`` is one of the three classes (the example sets two); ``priority_scheduling`` is for
    an OpenAI-style worker (vLLM with --scheduling-policy priority) only."""
    example = load_settings(ROOT / "config.example.json", env={})
    assert {name: t.priority for name, t in example.tenants.items()} == {"support": "interactive", "research": "batch"}
    assert not any(w.priority_scheduling for w in example.workers)
    vllm = {"name": "v", "url": "http://127.0.0.1:8000", "type": "openai", "priority_scheduling": True}
    assert load_document({"workers": [vllm]}).workers[0].priority_scheduling
    with pytest.raises(ConfigError, match=r"workers\[0\]: priority_scheduling is for an OpenAI-style worker"):
        load_document({"workers": [{**vllm, "type": "ollama"}]})
    with pytest.raises(ConfigError, match=r"tenants\.t\.priority: "):
        load_document({"tenants": {"t": {"priority": "urgent"}}})
    with pytest.raises(ConfigError, match=r"tenants\.t\.team_ceiling\.priority"):
        load_document({"tenants": {"t": {"team_ceiling": {"priority": "high"}}}})


def load_document(data: dict[str, object]) -> Settings:
    return settings_from_document(ROOT / "config.json", data, env={})
