"""Two gateways started on one data dir (replicas on one machine): the real `turnout serve` command twice, each on
its own port. Placement overrides written through both at the same moment are all kept (the override file's
lock), and a rule written through one is obeyed by the other at its next request (the data dir's change
counter), not at its next poll round."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import EmulatorFactory, free_port
from tests.support.cli import TURNOUT
from tests.support.served import Served
from turnout.store.db import Database, database_url
from turnout.store.keys import KeyStore

TOKEN = "admin-token-for-tests"
ROUNDS = 25


def _replicas(config: Path, ports: list[int], stack: ExitStack) -> Iterator[Served]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}, "TURNOUT_ADMIN_TOKEN": TOKEN}
    for port in ports:
        gateway = Served([*TURNOUT, "serve", "--config", str(config), "--port", str(port)], config.parent, env)
        stack.callback(gateway.kill)
        yield gateway


def _key(data: Path) -> str:
    db = Database(database_url(None, data))
    db.migrate()
    try:
        now = time.time()
        return KeyStore(db).create(
            app="t", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=now
        )[1]
    finally:
        db.close()


async def _call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None, key: str = TOKEN) -> Any:
    async with http.request(method, url, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json(content_type=None)


async def test_two_replicas_on_one_data_dir_share_placement_writes(emulator: EmulatorFactory, tmp_path: Path) -> None:
    a = await emulator("a", ["qwen3:8b"])
    b = await emulator("b", ["llama3.2:latest"])
    data = tmp_path / "data"
    config = tmp_path / "config.json"
    # health polls (which also re-read the override file) far apart: only the change counter can tell the other
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": str(data)},
                "health": {"interval_s": 600},
                "workers": [{"name": "a", "url": a.url}, {"name": "b", "url": b.url}],
            }
        )
    )
    key = _key(data)
    ports = [free_port(), free_port()]
    one, two = (f"http://127.0.0.1:{port}" for port in ports)
    chat = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with ExitStack() as stack:
        gateways = list(_replicas(config, ports, stack))
        for gateway in gateways:
            await asyncio.to_thread(gateway.wait_for, "serving on", 60)
        async with aiohttp.ClientSession() as http:
            assert (await _call(http, "POST", f"{two}/v1/chat/completions", chat, key))[0] == 200  # warm

            # both write at the same moment, each to its own worker, without If-Match (scripts do)
            async def toggles(url: str, worker: str) -> list[int]:
                statuses = []
                for n in range(ROUNDS):
                    path = f"{url}/admin/api/placement/workers/{worker}/toggle"
                    statuses.append((await _call(http, "POST", path, {"model": f"{worker}-{n}:1b"}))[0])
                return statuses

            done = await asyncio.gather(toggles(one, "a"), toggles(two, "b"))
            assert done == [[200] * ROUNDS] * 2
            on_disk = json.loads((data / "model-placement.json").read_text())["workers"]
            for worker in ("a", "b"):
                assert on_disk[worker]["denied_models"] == [f"{worker}-{n}:1b" for n in range(ROUNDS)], worker
            for url in (one, two):  # and each replica holds all of them
                _, matrix = await _call(http, "GET", f"{url}/admin/api/placement")
                rows = {row["name"]: row for row in matrix["workers"]}
                for worker in ("a", "b"):
                    assert len(rows[worker]["override"]["denied_models"]) == ROUNDS

            # a rule written through one replica is in force on the other at its next request
            status, _ = await _call(http, "POST", f"{one}/admin/api/placement/workers/a/toggle", {"model": "qwen3:8b"})
            assert status == 200
            served = a.served("/v1/chat/completions")
            status, body = await _call(http, "POST", f"{two}/v1/chat/completions", chat, key)
            assert status != 200, body  # only "a" has it, and "a" blocks it now
            assert a.served("/v1/chat/completions") == served
        for gateway in gateways:
            assert await asyncio.to_thread(gateway.stop, signal.SIGTERM, 60) == 0
