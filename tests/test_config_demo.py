"""The demo entry of workers[] (turnout.core.demo's model on a local engine): parsed apart from the workers, its
errors named by their field path in the file, in the schema, and in the starter config when the demo runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from turnout.config import ConfigError, config_schema, load_settings, starter_config

URL = "http://127.0.0.1:11434"


def _config(tmp_path: Path, workers: list[Any], **sections: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"workers": workers, **sections}))
    return path


def test_the_demo_entry_is_taken_out_of_the_workers(tmp_path: Path) -> None:
    local = {"name": "local", "url": URL, "type": "ollama"}
    settings = load_settings(_config(tmp_path, [local, {"name": "demo", "type": "demo", "threads": 2}]), env={})
    assert [w.name for w in settings.workers] == ["local"]
    assert settings.demo is not None and (settings.demo.name, settings.demo.threads) == ("demo", 2)
    assert settings.demo.sleep_after_s == 900
    assert load_settings(_config(tmp_path, [local]), env={}).demo is None


@pytest.mark.parametrize(
    ("workers", "sections", "problem"),
    [
        (
            [{"name": "local", "url": URL}, {"name": "demo", "type": "demo", "threads": 0}],
            {},
            "workers[1].threads: Input should be greater than or equal to 1",
        ),
        ([{"name": "demo", "type": "demo", "url": URL}], {}, "workers[0].url: Extra inputs are not permitted"),
        ([{"name": "demo", "type": "demo"}, {"name": "d2", "type": "demo"}], {}, "workers[1]: a second demo entry"),
        ([{"name": "demo", "url": URL}, {"name": "demo", "type": "demo"}], {}, "duplicate worker name 'demo'"),
        ([{"name": "demo", "type": "demo"}], {"pools": {"kubernetes": {}}}, "pools.kubernetes"),
        ([{"name": "demo", "type": "demo", "sleep_after_s": -1}], {}, "workers[0].sleep_after_s"),
        (
            [{"name": "demo", "type": "demo"}],
            {"pools": {"agents": [{"name": "demo", "agent_url": "http://10.0.0.5:8080"}]}},
            "pools.agents has a pool of that name",
        ),
    ],
)
def test_a_bad_demo_entry_names_its_field(
    tmp_path: Path, workers: list[Any], sections: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_config(tmp_path, workers, **sections), env={})
    assert problem in str(err.value), str(err.value)


def test_the_schema_takes_the_demo_entry_and_the_starter_with_it() -> None:
    schema = config_schema()
    jsonschema.validate(starter_config(demo=True), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"workers": [{"name": "demo", "type": "demo", "threads": 0}]}, schema)
    assert starter_config(demo=True)["workers"][-1] == {"name": "demo", "type": "demo"}
    assert starter_config() == {**starter_config(demo=True), "workers": starter_config(demo=True)["workers"][:1]}
