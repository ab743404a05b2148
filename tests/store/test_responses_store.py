"""Stored Responses API answers (turnout.store.responses, migration 0011) on SQLite and PostgreSQL: kept per app,
found only by that app, expiring, deleted; carried by backups and restores; and the gateway's side of them
(turnout.gateway.stored): a continuation's conversation, expiry after responses.store_days, the purge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.state.test_backup import NOW, make_state
from turnout.config import load_settings
from turnout.dialects.base import Call, Dialect, Endpoint
from turnout.errors import NotFound
from turnout.gateway.stored import StoredResponses
from turnout.state.backup import create_backup
from turnout.state.restore import restore_backup
from turnout.store.db import Database, database_url
from turnout.store.responses import ResponseStore, StoredResponse

DAY = 86_400.0


def record(rid: str, app: str | None, *, at: float = NOW, days: float = 30) -> StoredResponse:
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}], "id": "msg_1"}]
    answer = {"id": rid, "object": "response", "status": "completed", "output": [{"type": "message", "id": "msg_2"}]}
    return StoredResponse(rid, app, "qwen3:8b", None, at, at + days * DAY, items, answer)


def test_kept_per_app_expiring_and_deleted(database_url: str) -> None:
    db = Database(database_url)
    db.migrate()
    store = ResponseStore(db)
    try:
        store.put(record("resp_a", "web"))
        store.put(record("resp_open", None))
        store.put(record("resp_old", "web", at=NOW - 40 * DAY))
        found = store.get("resp_a", "web", NOW)
        assert found is not None and found.input_items[0]["id"] == "msg_1" and found.response["status"] == "completed"
        assert store.get("resp_a", "other", NOW) is None  # another app's: as if it did not exist
        assert store.get("resp_a", None, NOW) is None and store.get("resp_open", None, NOW) is not None
        assert store.get("resp_old", "web", NOW) is None  # expired: never returned
        assert store.get("resp_a", "web", NOW + 31 * DAY) is None
        store.put(record("resp_a", "web", days=1))  # the same id again replaces it
        assert store.get("resp_a", "web", NOW + 2 * DAY) is None
        assert store.delete("resp_a", "other") is False and store.delete("resp_a", "web") is True
        assert store.get("resp_a", "web", NOW) is None and store.delete("resp_a", "web") is False
        assert store.purge(NOW) == 1  # resp_old
        assert store.get("resp_open", None, NOW) is not None
        # a batch (the gateway writes the answers that wait together), an id twice in it: the last one
        store.put_many([record("resp_b", "web"), record("resp_c", "web"), record("resp_b", "web", days=1)])
        assert store.get("resp_c", "web", NOW) is not None
        kept = store.get("resp_b", "web", NOW)
        assert kept is not None and kept.expires_at == NOW + DAY
    finally:
        db.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_backups_carry_the_stored_responses(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    database = request.getfixturevalue("postgres_database") if backend == "postgresql" else None
    config = make_state(tmp_path, database=database, agents=False)
    settings = load_settings(config, env={})
    url = database_url(settings.storage.database_url, settings.data_dir)
    db = Database(url)
    ResponseStore(db).put(record("resp_kept", "web"))
    db.close()
    out = tmp_path / "b.zip"
    created = create_backup(settings, out, now=NOW)
    if backend == "postgresql":
        assert "responses" in created.manifest.tables
    db = Database(url)
    assert ResponseStore(db).delete("resp_kept", "web")
    db.close()
    restore_backup(out, config, env={})
    db = Database(url)
    try:
        kept = ResponseStore(db).get("resp_kept", "web", NOW)
        assert kept is not None and kept.response["output"] == [{"type": "message", "id": "msg_2"}]
    finally:
        db.close()


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Key:
    def __init__(self, app: str) -> None:
        self.app = app


def call_of(payload: dict[str, Any]) -> Call:
    body = json.dumps(payload).encode()
    return Call(Dialect.RESPONSES, Endpoint.RESPONSES, "/v1/responses", body, payload, "qwen3:8b", False)


async def test_the_gateway_side_continuation_expiry_and_purge(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    db.migrate()
    clock = Clock()
    stored = StoredResponses(ResponseStore(db), keep_days=2, clock=clock)
    key: Any = Key("web")
    try:
        first = await stored.prepare(key, call_of({"model": "qwen3:8b", "input": "hello", "instructions": "be nice"}))
        assert first.answer_id.startswith("resp_") and first.payload["input"] == "hello"
        keep = stored.keeper(key, first)
        assert keep is not None
        output = [
            {
                "id": "msg_out",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi!"}],
            }
        ]
        await keep(
            {"type": "response.completed", "response": {"id": first.answer_id, "object": "response", "output": output}}
        )
        # a continuation: the stored conversation, its answer, then the new input; no instructions carried over
        second = await stored.prepare(
            key, call_of({"model": "qwen3:8b", "input": "again", "previous_response_id": first.answer_id})
        )
        items = second.payload["input"]
        assert [i.get("role") for i in items] == ["user", "assistant", "user"] and items[1]["id"] == "msg_out"
        assert "previous_response_id" not in json.loads(second.body)  # what a worker serving the API itself gets
        assert second.payload["previous_response_id"] == first.answer_id  # echoed in the answer
        assert stored.keeper(key, call_of({"model": "m", "input": "x", "store": False})) is None
        with pytest.raises(NotFound):
            await stored.prepare(
                Key("other"), call_of({"model": "m", "input": "x", "previous_response_id": first.answer_id})
            )  # type: ignore[arg-type]
        clock.now += 3 * DAY  # past responses.store_days
        with pytest.raises(NotFound, match="kept for 2 days"):
            await stored.prepare(key, call_of({"model": "m", "input": "x", "previous_response_id": first.answer_id}))
        # the next write purges what expired (in the background, at most once a minute)
        later = await stored.prepare(key, call_of({"model": "m", "input": "z"}))
        keep = stored.keeper(key, later)
        assert keep is not None
        await keep({"id": later.answer_id, "object": "response", "output": []})
        await stored.close()
        with db.engine.connect() as conn:
            assert [r[0] for r in conn.exec_driver_sql("SELECT id FROM responses")] == [later.answer_id]
    finally:
        db.close()
