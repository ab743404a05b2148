"""Runtime model aliases are part of the store a backup holds: a restore brings them back as they were, on SQLite
and on PostgreSQL (where each table is exported on its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnout.config import load_settings
from turnout.state.backup import create_backup
from turnout.state.restore import restore_backup
from turnout.state.store_export import KEPT_TABLES
from turnout.store.aliases import AliasStore
from turnout.store.db import Database, database_url

NOW = 1_800_000_000.0


def _aliases(config: Path) -> dict[str, str]:
    settings = load_settings(config, env={})
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    try:
        return {r.name: r.model for r in AliasStore(db).all()}
    finally:
        db.close()


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_restore_brings_the_aliases_back(tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    assert "model_aliases" not in KEPT_TABLES
    config = tmp_path / "etc" / "config.json"
    config.parent.mkdir(parents=True)
    storage: dict[str, str] = {"data_dir": "../data"}
    if store == "postgresql":
        storage["database_url"] = request.getfixturevalue("postgres_database")
    config.write_text(json.dumps({"storage": storage, "aliases": {"gpt-5-codex": "qwen3-coder:30b"}}))
    settings = load_settings(config, env={})
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    db.migrate()
    AliasStore(db).put("claude-sonnet-4-5", "qwen3-coder:30b", now=NOW)
    AliasStore(db).put("mac/haiku", "mac/llama3.2", now=NOW)
    db.close()
    out = tmp_path / "b.zip"
    created = create_backup(settings, out, now=NOW)
    if store == "postgresql":
        assert created.manifest.file("store/model_aliases.jsonl") is not None
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    AliasStore(db).remove("claude-sonnet-4-5")
    AliasStore(db).put("late", "m", now=NOW + 1)
    db.close()
    assert _aliases(config) == {"late": "m", "mac/haiku": "mac/llama3.2"}
    restore_backup(out, config, env={})
    assert _aliases(config) == {"claude-sonnet-4-5": "qwen3-coder:30b", "mac/haiku": "mac/llama3.2"}
    assert load_settings(config, env={}).aliases == {"gpt-5-codex": "qwen3-coder:30b"}  # the config's, in the ZIP
