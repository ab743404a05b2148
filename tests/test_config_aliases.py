"""The config's ``aliases``: accepted as a map of alias -> model, refused with the alias named when it cannot be
used (a pattern, a chain, a cycle, two spellings of one name, an alias for itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnout.config import ConfigError, load_settings


def _load(tmp_path: Path, aliases: object) -> object:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"aliases": aliases}))
    return load_settings(path, env={}).aliases


def test_aliases_are_read(tmp_path: Path) -> None:
    aliases = {"claude-sonnet-4-5": "qwen3-coder:30b", "gpt-5-codex": "mac/qwen2.5:7b"}
    assert _load(tmp_path, aliases) == aliases
    assert _load(tmp_path, {}) == {}


@pytest.mark.parametrize(
    ("aliases", "fragments"),
    [
        ({"a": "b", "b": "c"}, ['aliases: "a": "b" is itself an alias (of "c")', 'point "a" at "c" instead']),
        ({"a": "b", "b": "a"}, ['"a": "b" is itself an alias', '"b": "a" is itself an alias']),
        ({"claude-*": "m"}, ['"claude-*": "name" must be one model name, not a pattern']),
        ({"a": "m*"}, ['"a": "model" must be one model name']),
        ({"a": "a:latest"}, ['"a": an alias cannot stand for itself']),
        ({"a": "m", "a:latest": "n"}, ['"a" and "a:latest" are one name']),
        ({"a": ""}, ['"model" is empty']),
        ({"a": 3}, ["aliases.a", "string"]),
        (["a"], ["aliases", "dictionary"]),
    ],
)
def test_bad_aliases_stop_the_start_naming_them(tmp_path: Path, aliases: object, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, aliases)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
