"""The gateway's cache of API key lookups: single flight, refresh ahead, never past ``auth.key_cache_s``.

A real store (SQLite in a temporary directory); the store read is wrapped to count calls and to hold a lookup
open while the test looks at what the requests do meanwhile. The cache's clock is a variable of the test.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from turnout.config import load_settings
from turnout.errors import Unauthorized
from turnout.gateway.accounting import Accountant
from turnout.store.db import Database, database_url
from turnout.store.keys import KeyRecord, KeyStore
from turnout.store.usage import UsageStore

TTL = 10.0


@dataclass
class Store:
    """Counts store reads; while ``hold`` is clear, a read waits (after reading) before it answers."""

    keys: KeyStore
    reads: int = 0
    hold: threading.Event = field(default_factory=threading.Event)

    def find(self, plaintext: str) -> KeyRecord | None:
        record = self.keys.find(plaintext)
        self.reads += 1
        assert self.hold.wait(10), "the test never released the store read"
        return record


@dataclass
class Harness:
    accountant: Accountant
    store: Store
    token: str
    now: list[float]

    async def auth(self) -> KeyRecord | None:
        request = make_mocked_request("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {self.token}"})
        return await self.accountant.authenticate(request)


async def until(check: object, what: str) -> None:
    """Yield to the loop (and the store's thread) until ``check()`` holds; bounded in time."""
    deadline = time.monotonic() + 10
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    (tmp_path / "config.json").write_text(json.dumps({"auth": {"open": False, "key_cache_s": TTL}}))
    settings = load_settings(tmp_path / "config.json")
    database = Database(database_url(None, tmp_path))
    database.migrate()
    keys = KeyStore(database)
    _, token = keys.create(
        app="app", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=time.time()
    )
    store = Store(keys)
    now = [1000.0]
    accountant = Accountant(settings, keys, UsageStore(database), clock=lambda: now[0])
    accountant.keys = store  # type: ignore[assignment]  # the same store, its reads counted
    yield Harness(accountant, store, token, now)
    store.hold.set()
    database.close()


async def test_concurrent_requests_share_one_store_read(harness: Harness) -> None:
    waiting = [asyncio.create_task(harness.auth()) for _ in range(50)]
    await until(lambda: harness.store.reads >= 1, "the first store read")
    await asyncio.sleep(0.05)  # room for more reads, if the cache let them through (it must not)
    harness.store.hold.set()
    records = await asyncio.gather(*waiting)
    assert harness.store.reads == 1
    assert all(r is not None and r.id == records[0].id for r in records)  # type: ignore[union-attr]


async def test_a_busy_key_is_renewed_before_it_expires_without_waiting(harness: Harness) -> None:
    harness.store.hold.set()
    first = await harness.auth()
    assert first is not None and harness.store.reads == 1
    harness.store.hold.clear()
    harness.now[0] += TTL * 0.8  # in the last quarter of the entry's life
    # answered from the cache while the store read it started is still held open
    assert await asyncio.wait_for(harness.auth(), 10) == first
    await until(lambda: harness.store.reads == 2, "the refresh's store read")
    assert await asyncio.wait_for(harness.auth(), 10) == first  # one refresh at a time
    harness.store.hold.set()
    await until(lambda: not harness.accountant._loading, "the refresh to finish")
    harness.now[0] += TTL * 0.5  # past the first entry's end, inside the renewed one's
    assert await harness.auth() == first
    assert harness.store.reads == 2


async def test_an_entry_is_never_used_past_its_life(harness: Harness) -> None:
    harness.store.hold.set()
    assert await harness.auth() is not None
    harness.store.keys.revoke(harness.token[:10], now=time.time())  # written to the store, no forget()
    harness.now[0] += TTL  # the entry's end, no request in between to refresh it
    with pytest.raises(Unauthorized, match="revoked"):
        await harness.auth()


async def test_forget_drops_a_lookup_under_way(harness: Harness) -> None:
    """A revoke through the admin API calls forget(); a lookup that read the key before it cannot put the
    unrevoked key back in the cache."""
    before = asyncio.create_task(harness.auth())
    await until(lambda: harness.store.reads == 1, "the store read")  # read, not yet answered
    harness.store.keys.revoke(harness.token[:10], now=time.time())
    harness.accountant.forget()
    harness.store.hold.set()
    assert await before is not None  # it began before the revoke
    with pytest.raises(Unauthorized, match="revoked"):
        await harness.auth()
