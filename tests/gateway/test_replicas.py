"""Two gateway processes sharing PostgreSQL and a real Redis: limits hold across replicas."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from tests.conftest import EmulatorFactory, free_port
from tests.support.cli import TURNOUT
from turnout.store.db import Database
from turnout.store.keys import KeyStore


@contextmanager
def replica(config: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "TURNOUT_ADMIN_TOKEN": "t"}
    proc = subprocess.Popen(
        [*TURNOUT, "serve", "--config", str(config), "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


async def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{url}/healthz") as r:
                    if r.status == 200 and (await r.json())["healthy_workers"] == 1:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} not ready")


async def test_rpm_exact_across_two_replicas(
    emulator: EmulatorFactory, postgres_database: str, redis_url: str, tmp_path: Path
) -> None:
    database_url = postgres_database
    emu = await emulator("a", ["qwen3:8b"], token_delay_s=0.002)
    db = Database(database_url)
    db.migrate()
    key = KeyStore(db).create(
        app="load", tenant=None, scopes=["*"], rpm=50, daily_tokens=None, expires_at=None, now=time.time()
    )[1]
    db.close()
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": str(tmp_path / "data"), "database_url": database_url, "redis_url": redis_url},
                "workers": [{"name": "a", "url": emu.url}],
            }
        )
    )
    with replica(config) as one, replica(config) as two:
        await asyncio.gather(wait_ready(one), wait_ready(two))
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {key}"}, connector=aiohttp.TCPConnector(limit=0)
        ) as http:

            async def call(i: int) -> int:
                url = one if i % 2 else two
                body = {"model": "qwen3:8b", "messages": [], "stream": False}
                async with http.post(f"{url}/api/chat", json=body) as r:
                    await r.read()
                    return r.status

            statuses = await asyncio.gather(*(call(i) for i in range(200)))
    assert statuses.count(200) == 50 and statuses.count(429) == 150
    assert emu.served("/api/chat") == 50
