"""Priority classes in the store (migration 0016) on SQLite and PostgreSQL: a key's class (set, changed, removed,
copied by a rotation) and its tenant's default; the migration makes exactly the columns, goes down and up again;
backups carry both and a restore brings them back."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tests.state.test_backup import NOW, make_state
from turnout.config import load_settings
from turnout.core.admission import Priority
from turnout.state.backup import create_backup
from turnout.state.restore import restore_backup
from turnout.store.db import Database
from turnout.store.db import database_url as store_url
from turnout.store.keys import KeyStore, UnknownTenant
from turnout.store.schema import metadata

INT, S, B = Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH


@pytest.fixture
def keys(database_url: str) -> KeyStore:
    db = Database(database_url)
    db.migrate()
    yield KeyStore(db)  # type: ignore[misc]
    db.close()


def _create(keys: KeyStore, app: str, tenant: str | None = None, priority: Priority | None = None) -> int:
    record, _ = keys.create(
        app=app, tenant=tenant, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=NOW, priority=priority
    )
    return record.id


def test_a_keys_class_is_set_changed_removed_and_kept_by_a_rotation(keys: KeyStore) -> None:
    plain = _create(keys, "web")
    urgent = _create(keys, "agent", priority=INT)
    assert keys.get(str(plain)).priority is None and keys.get(str(urgent)).priority is INT
    assert keys.get(str(urgent)).stored_json()["priority"] == "interactive"  # in what the ETag covers
    before, after = keys.update(str(plain), now=NOW, priority=B)
    assert (before.priority, after.priority) == (None, B)
    assert keys.update(str(plain), now=NOW, rpm=5)[1].priority is B  # not given: unchanged
    assert keys.update(str(plain), now=NOW, priority=None)[1].priority is None  # removed: the tenant's default
    _, new, _ = keys.rotate(str(urgent), grace_s=60, now=NOW)
    assert new.priority is INT  # the new key keeps the class, as it keeps scopes and limits


def test_a_tenants_default_is_read_with_its_keys_and_listed(keys: KeyStore) -> None:
    key = _create(keys, "nightly", tenant="research")
    _create(keys, "chat", tenant="support")
    assert keys.set_tenant_priority("research", B) == (None, B)
    record = keys.get(str(key))
    assert record.tenant_priority is B and record.priority is None
    assert record.priority_class(None) is B  # the store's default
    assert record.priority_class(S) is S  # config.json's, where it sets one, before the store's
    assert keys.update(str(key), now=NOW, priority=INT)[1].priority_class(B) is INT  # the key's own before either
    listed = {t["name"]: t["priority"] for t in keys.tenants()}
    assert listed == {"research": "batch", "support": None}
    seen: list[Priority | None] = []
    assert keys.set_tenant_priority("research", None, check=seen.append) == (B, None)
    assert seen == [B] and keys.get(str(key)).tenant_priority is None


def test_a_tenant_that_does_not_exist_is_not_made_by_a_default(keys: KeyStore) -> None:
    with pytest.raises(UnknownTenant, match='no tenant "nobody"'):
        keys.set_tenant_priority("nobody", B)
    assert keys.tenants() == []


def test_a_class_no_release_writes_counts_as_not_set(keys: KeyStore) -> None:
    """A hand-edited row (or a crafted backup) does not stop keys from being read."""
    from sqlalchemy import update

    from turnout.store.schema import keys as key_table

    key = _create(keys, "web", priority=B)
    with keys.db.begin() as conn:
        conn.execute(update(key_table).where(key_table.c.id == key).values(priority="urgent"))
    assert keys.get(str(key)).priority is None and keys.get(str(key)).priority_class(None) is S


def test_the_migration_makes_exactly_the_columns(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    try:
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert [d for d in diff if "priority" in repr(d)] == []
    finally:
        db.close()


def test_the_migration_goes_down_and_up_again(database_url: str) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig
    from sqlalchemy import inspect

    from turnout.store.db import _MIGRATIONS

    db = Database(database_url)
    db.migrate()
    keys = KeyStore(db)
    _create(keys, "web", priority=B)
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    try:
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0015")
        for table in ("keys", "tenants"):
            assert "priority" not in {c["name"] for c in inspect(db.engine).get_columns(table)}
        db.migrate()
        assert [r.priority for r in keys.all()] == [None]  # the key stayed; its class went with the column
        assert keys.update("1", now=NOW, priority=INT)[1].priority is INT
    finally:
        db.close()


def test_backups_carry_classes_and_a_restore_brings_them_back(tmp_path: Path, database_url: str) -> None:
    config = make_state(tmp_path, database=None if database_url.startswith("sqlite") else database_url)
    settings = load_settings(config, env={})
    url = store_url(settings.storage.database_url, settings.data_dir)
    db = Database(url)
    keys = KeyStore(db)
    key = _create(keys, "nightly", tenant="research", priority=INT)
    keys.set_tenant_priority("research", B)
    db.close()
    archive = tmp_path / "backup.zip"
    create_backup(settings, archive, now=NOW)
    db = Database(url)
    keys = KeyStore(db)
    keys.update(str(key), now=NOW, priority=None)  # after the backup: undone by the restore
    keys.set_tenant_priority("research", S)
    db.close()
    restore_backup(archive, config, env={})
    db = Database(url)
    try:
        record = KeyStore(db).get(str(key))
        assert (record.priority, record.tenant_priority) == (INT, B)
    finally:
        db.close()
