"""How soon an admin change made through one replica is in force on every replica, and what following the changes
costs an idle replica (issue 33, item 6).

    python bench/changes.py [--replicas 3] [--rounds 30] [--idle-s 10]

Starts the replica harness of the tests (tests/support/replicas.py: its own PostgreSQL, Redis, N `turnout serve`
processes with their own data dirs; no load balancer, each replica is asked directly), twice: with
``storage.redis_url`` (a change is published on Redis) and without (the store's change version is polled every
0.5 s). Each round, after a random pause of up to 0.5 s (so that changes do not keep step with the replicas' polls),
puts or removes a placement override of the one worker through replica ``round % N`` and polls every other
replica's ``GET /admin/api/placement/workers/a`` every 5 ms until it shows the change; the table gives
the time from the write's answer to each replica's first showing it (p50, p90, max over every replica and round).
Then the fleet idles ``--idle-s`` seconds and each replica's CPU (utime + stime from /proc) is read before and
after: the cost of polling the store's version (and listening on Redis) with nothing else to do.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.ollama_emulator import Behaviour, OllamaEmulator  # noqa: E402
from tests.support.replicas import ReplicaFleet  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def source(http: aiohttp.ClientSession, fleet: ReplicaFleet, url: str) -> str:
    async with http.get(f"{url}/admin/api/placement/workers/a", headers=fleet.admin_headers) as r:
        return str((await r.json())["source"])


async def rounds(fleet: ReplicaFleet, count: int) -> list[float]:
    took: list[float] = []
    async with aiohttp.ClientSession() as http:
        for n in range(count):
            writer = fleet.urls[n % len(fleet.urls)]
            path = f"{writer}/admin/api/placement/workers/a"
            if n % 2 == 0:
                call = http.put(path, json={"mode": "whitelist"}, headers=fleet.admin_headers)
                wanted = "override"
            else:
                call = http.delete(path, headers=fleet.admin_headers)
                wanted = "config"
            await asyncio.sleep(random.uniform(0, 0.5))  # a change comes at any point of the replicas' poll
            async with call as r:
                assert r.status == 200, await r.text()
            since = time.monotonic()
            waiting = [u for u in fleet.urls if u != writer]
            while waiting:
                for url in list(waiting):
                    if await source(http, fleet, url) == wanted:
                        took.append(time.monotonic() - since)
                        waiting.remove(url)
                if time.monotonic() - since > 10:
                    raise SystemExit(f"round {n}: not in force on {waiting} after 10 s")
                await asyncio.sleep(0.005)
    return took


async def measure(workdir: Path, worker: str, replicas: int, count: int, idle_s: float, redis: bool) -> dict[str, Any]:
    config = {"workers": [{"name": "a", "url": worker, "type": "ollama"}], "health": {"interval_s": 2}}
    fleet = ReplicaFleet(workdir, config, replicas=replicas, redis=redis, balancer=False, log_level="warning")
    async with fleet:
        took = await rounds(fleet, count)
        pids = [r.proc.pid for r in fleet.replicas if r.proc is not None]
        before = [cpu_s(p) for p in pids]
        await asyncio.sleep(idle_s)  # the measured idle time itself, not a wait for something
        idle = [(cpu_s(p) - b) / idle_s * 1000 for p, b in zip(pids, before, strict=True)]
    ms = sorted(t * 1000 for t in took)
    return {
        "p50": statistics.median(ms),
        "p90": ms[int(0.9 * (len(ms) - 1))],
        "max": ms[-1],
        "n": len(ms),
        "idle_cpu_ms_per_s": statistics.mean(idle),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    emulator = OllamaEmulator("a", Behaviour(models=["qwen3:8b"]))
    await emulator.start()
    try:
        with tempfile.TemporaryDirectory(prefix="turnout-bench-changes-") as tmp:
            rows = []
            for redis in (True, False):
                label = "store + Redis" if redis else "store poll only"
                result = await measure(
                    Path(tmp) / label.split()[-1], emulator.url, args.replicas, args.rounds, args.idle_s, redis
                )
                rows.append((label, result))
    finally:
        await emulator.stop()
    print(f"{args.replicas} replicas, {args.rounds} placement changes each way, each through one replica")
    print(f"| {'how changes travel':<18} | in force on the others: p50 ms | p90 ms | max ms | n | idle CPU ms/s |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        print(
            f"| {label:<18} | {r['p50']:.0f} | {r['p90']:.0f} | {r['max']:.0f} | {r['n']} | "
            f"{r['idle_cpu_ms_per_s']:.1f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
