"""Store additions for the admin UI, on SQLite and PostgreSQL: guarded updates (If-Match checks inside the
transaction), key changes and states, endpoint keys revoked with their endpoint, tenants and apps,
last_used, fallback counts, filtered summaries and series."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from turnout.core.patterns import parse_pattern
from turnout.store.db import Database, StoreError
from turnout.store.endpoints import EndpointExists, EndpointRecord, EndpointStore
from turnout.store.keys import KeyRecord, KeyRevoked, KeyStore, StaleRecord
from turnout.store.usage import UsageFilter, UsageRow, UsageStore, to_csv

NOW = 1_800_000_000.0


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    database.migrate()
    yield database
    database.close()


def make_key(keys: KeyStore, app: str = "web", **extra: object) -> KeyRecord:
    args: dict[str, object] = {
        "app": app,
        "tenant": None,
        "scopes": ["*"],
        "rpm": None,
        "daily_tokens": None,
        "expires_at": None,
        "now": NOW,
    }
    args.update(extra)
    record, _ = keys.create(**args)  # type: ignore[arg-type]
    return record


def test_key_update_only_what_is_given(db: Database) -> None:
    keys = KeyStore(db)
    record = make_key(keys, rpm=5, daily_tokens=100)
    before, after = keys.update(record.prefix, now=NOW, scopes=["qwen3:*"], rpm=None)
    assert before.rpm == 5 and after.rpm is None and after.daily_tokens == 100
    assert [p.text for p in after.scopes] == ["qwen3:*"] and after.expires_at is None
    _, after = keys.update(str(record.id), now=NOW, expires_at=NOW + 60)
    assert after.expires_at == NOW + 60 and after.state(NOW) == "active" and after.state(NOW + 61) == "expired"
    with pytest.raises(StoreError, match="rpm must be from 1"):
        keys.update(record.prefix, now=NOW, rpm=0)
    assert keys.get(record.prefix).rpm is None


def test_key_update_check_runs_with_the_row_and_refuses_a_revoked_key(db: Database) -> None:
    keys = KeyStore(db)
    record = make_key(keys, rpm=5)

    class Stale(Exception):
        pass

    def refuse(current: KeyRecord) -> None:
        assert current.id == record.id
        raise Stale

    with pytest.raises(Stale):
        keys.update(record.prefix, now=NOW, rpm=9, check=refuse)
    with pytest.raises(Stale):
        keys.revoke(record.prefix, now=NOW, check=refuse)
    with pytest.raises(Stale):
        keys.rotate(record.prefix, grace_s=10, now=NOW, check=refuse)
    assert keys.get(record.prefix).rpm == 5 and keys.get(record.prefix).revoked_at is None and keys.count() == 1
    keys.revoke(record.prefix, now=NOW)
    with pytest.raises(KeyRevoked):
        keys.update(record.prefix, now=NOW + 1, rpm=9)


def test_key_states(db: Database) -> None:
    keys = KeyStore(db)
    old = make_key(keys)
    old, new, _ = keys.rotate(old.prefix, grace_s=100, now=NOW)
    assert old.state(NOW) == "in_grace" and old.rotated_to == new.id and new.state(NOW) == "active"
    assert old.to_json(NOW)["grace_until"] == NOW + 100 and old.state(NOW + 100) == "expired"
    _, gone = keys.revoke(new.prefix, now=NOW)
    assert gone.to_json(NOW)["state"] == "revoked" and gone.to_json(NOW)["grace_until"] is None


def test_revoke_endpoint_keys_only_the_printed_ones(db: Database) -> None:
    keys = KeyStore(db)
    printed = make_key(keys, app="endpoint-mac", scopes=["mac/*"])
    _, rotated, _ = keys.rotate(printed.prefix, grace_s=100, now=NOW)
    manual = make_key(keys, app="endpoint-mac", scopes=["*"])  # made by hand for that app: not printed
    other = make_key(keys, app="endpoint-mac2", scopes=["mac2/*"])
    revoked = keys.revoke_endpoint_keys("mac", now=NOW)
    assert sorted(after.id for _, after in revoked) == [printed.id, rotated.id]
    assert keys.get(manual.prefix).revoked_at is None and keys.get(other.prefix).revoked_at is None
    assert keys.revoke_endpoint_keys("mac", now=NOW) == []  # already revoked


def test_tenants_and_apps(db: Database) -> None:
    keys = KeyStore(db)
    make_key(keys, app="web", tenant="team-a")
    make_key(keys, app="web")
    make_key(keys, app="batch", tenant="team-b")
    keys.ensure_tenant("empty", max_concurrent=3, weight=2, now=NOW)
    assert [(t["name"], t["apps"], t["keys"], t["weight"]) for t in keys.tenants()] == [
        ("empty", 0, 0, 2),
        ("team-a", 1, 2, 1),
        ("team-b", 1, 1, 1),
    ]
    assert [(a["name"], a["tenant"], a["keys"]) for a in keys.apps()] == [("batch", "team-b", 1), ("web", "team-a", 2)]


def test_reaches_endpoint() -> None:
    def key(*scopes: str) -> KeyRecord:
        patterns = tuple(parse_pattern(s) for s in scopes)
        return KeyRecord(1, "tk_", "a", "t", 1, None, 1, patterns, None, None, None, None, 1, NOW)

    assert key("*").reaches_endpoint("mac") and key("mac/*").reaches_endpoint("mac")
    assert key("mac/llama3").reaches_endpoint("mac") and key("m*").reaches_endpoint("mac")
    assert not key("mac2/*").reaches_endpoint("mac") and not key("qwen3:*").reaches_endpoint("mac")
    assert not key("macx").reaches_endpoint("mac")


def add_endpoint(store: EndpointStore, name: str = "mac") -> EndpointRecord:
    return store.add(
        name=name, url="http://h:1", api="ollama", credential=None, fallback_model=None, latency_budget_ms=None, now=NOW
    )


def test_endpoint_duplicate_and_guarded_writes(db: Database) -> None:
    store = EndpointStore(db)
    record = add_endpoint(store)
    with pytest.raises(EndpointExists, match="already exists"):
        add_endpoint(store)
    seen: list[EndpointRecord] = []
    before, after = store.update("mac", {"latency_budget_ms": 10}, now=NOW + 1, check=seen.append)
    assert seen == [record] and before == record and after.latency_budget_ms == 10 and after.updated_at == NOW + 1

    def refuse(current: EndpointRecord) -> None:
        raise RuntimeError("stale")

    with pytest.raises(RuntimeError):
        store.update("mac", {"latency_budget_ms": 20}, now=NOW + 2, check=refuse)
    with pytest.raises(RuntimeError):
        store.remove("mac", check=refuse)
    assert store.get("mac").latency_budget_ms == 10
    keys = KeyStore(db)
    make_key(keys, app="endpoint-mac", scopes=["mac/*"])

    def fail_after_revoking(conn: object) -> None:
        keys.revoke_endpoint_keys("mac", now=NOW, conn=conn)  # type: ignore[arg-type]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.remove_and("mac", then=fail_after_revoking)
    assert store.exists("mac") and keys.all()[0].revoked_at is None  # neither happened
    removed, revoked = store.remove_and("mac", then=lambda conn: keys.revoke_endpoint_keys("mac", now=NOW, conn=conn))
    assert removed.name == "mac" and revoked is not None and len(revoked) == 1 and not store.exists("mac")


def test_concurrent_endpoint_updates_never_lose_one(db: Database) -> None:
    """Two writers both pass their check against the same version; the one that writes second is refused
    (StaleRecord, or SQLite's stale snapshot), never overwrites the first silently."""
    store = EndpointStore(db)
    add_endpoint(store)
    gate = threading.Barrier(2)
    outcomes: list[str] = []

    def writer(budget: int) -> None:
        def check(current: EndpointRecord) -> None:
            if current.updated_at != NOW:
                raise RuntimeError("changed")  # the If-Match of a client that read the first version
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(timeout=5)

        try:
            store.update("mac", {"latency_budget_ms": budget}, now=NOW + budget, check=check)
            outcomes.append("written")
        except (StaleRecord, RuntimeError):
            outcomes.append("refused")
        except StoreError:
            outcomes.append("refused")  # SQLite: the second writer's snapshot is stale (busy)

    threads = [threading.Thread(target=writer, args=(b,)) for b in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["refused", "written"]
    assert store.get("mac").latency_budget_ms in (1, 2)


def rows() -> list[UsageRow]:
    m = NOW
    return [
        UsageRow(m, 1, "openai:chat", "llama3.2", "a", 200, False, 3, 4, 10.0),
        UsageRow(m + 1, 1, "openai:chat", "llama3.2", "a", 500, True, 0, 0, 30.0),
        UsageRow(m + 120, 2, "ollama:chat", "mac/x", "mac", 200, False, 1, 1, 5.0),
        UsageRow(m + 130, 2, "ollama:chat", "mac/x", "a", 200, False, 1, 1, 5.0, "mac/x"),
        UsageRow(m + 7200, None, "ollama:chat", "q", "b", 200, False, 1, 1, 5.0),
    ]


def test_last_used_and_fallback_counts(db: Database) -> None:
    usage = UsageStore(db)
    usage.insert_many(rows())
    assert usage.last_used() == {1: NOW // 60 * 60, 2: (NOW + 130) // 60 * 60}
    assert usage.fallback_counts(since=NOW) == {"mac": {"total": 1, "since": 1}}
    assert usage.fallback_counts(since=NOW + 3600) == {"mac": {"total": 1, "since": 0}}


@pytest.mark.parametrize(
    ("where", "requests"),
    [
        (UsageFilter(), 5),
        (UsageFilter(key_id=1), 2),
        (UsageFilter(worker="a"), 3),
        (UsageFilter(endpoint="mac"), 2),  # served by it, or fell back from it
        (UsageFilter(endpoint="ma_"), 0),
        (UsageFilter(model="mac/x", worker="a"), 1),
        (UsageFilter(route="openai:chat"), 2),
    ],
)
def test_filtered_summary(db: Database, where: UsageFilter, requests: int) -> None:
    usage = UsageStore(db)
    usage.insert_many(rows())
    assert sum(r["requests"] for r in usage.summary(since=0, where=where)) == requests


def test_series_has_every_bucket(db: Database) -> None:
    usage = UsageStore(db)
    usage.insert_many(rows())
    points = usage.series(since=NOW, until=NOW + 3 * 3600, bucket="hour")
    start = NOW // 3600 * 3600
    assert [p["bucket_start"] for p in points] == [start + i * 3600 for i in range(4)]
    assert [p["requests"] for p in points] == [4, 0, 1, 0]
    first = points[0]
    assert first["errors"] == 1 and first["prompt_tokens"] == 5 and 5 <= first["latency_ms_p50"] <= 30
    assert points[1]["latency_ms_p95"] is None and points[1]["completion_tokens"] == 0
    minutes = usage.series(since=NOW, until=NOW + 180, bucket="minute", where=UsageFilter(key_id=2))
    assert sum(p["requests"] for p in minutes) == 2 and len(minutes) == 4
    with pytest.raises(ValueError, match="more than 5000"):
        usage.series(since=0, until=NOW, bucket="minute")
    text = to_csv(points, ("bucket_start", "bucket_start_utc", "requests"))
    assert text.splitlines()[1].endswith(",4") and "T" in text.splitlines()[1]


def test_audit_filters_and_facets(db: Database) -> None:
    from turnout.store.audit import AuditLog

    log = AuditLog(db)
    log.record(actor="admin-api", action="key.create", target="key:tk_aaa", now=NOW)
    log.record(actor="cli:root", action="key.revoke", target="key:tk_aaa", now=NOW + 10)
    log.record(actor="cli:ops", action="placement.toggle", target="worker:a model:x", now=NOW + 20)
    log.record(actor="admin-api", action="key.create", target="key:tk_a_b", now=NOW + 30)

    def actions(**where: object) -> list[str]:
        return [e.action for e in log.entries(**where)]  # type: ignore[arg-type]

    assert actions(actor="cli:*") == ["placement.toggle", "key.revoke"]
    assert actions(actor="cli:root") == ["key.revoke"] and actions(actor="cli") == []
    assert actions(target="key:tk_aaa") == ["key.revoke", "key.create"]
    assert actions(target="key:tk_a_") == ["key.create"]  # '_' is a character here, not a wildcard
    assert actions(since=NOW + 10, until=NOW + 30) == ["placement.toggle", "key.revoke"]
    assert log.facets() == {
        "actions": ["key.create", "key.revoke", "placement.toggle"],
        "actors": ["admin-api", "cli:ops", "cli:root"],
    }
