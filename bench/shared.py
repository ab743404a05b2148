"""Three gateway replicas that route as one: caps, fairness and faults, against one replica, in one run.

The fleet (``tests/support/replicas.py``): PostgreSQL, Redis, N `turnout serve` processes each with its own data dir,
and nginx round robin in front. The worker is an Ollama emulator served by this process (`tests/support/
ollama_emulator.py`) that counts the requests it holds at once (``peak_active``), each answer a few tokens with a
delay between them.

- **caps**: 300 requests from 24 clients through nginx, against a worker capped three ways in turn (the worker's
  ``max_concurrent: 2``; a tenant's ``max_concurrent: 2``; ``routing.model_max_concurrent`` of 2): the most the
  worker held at once (never 3), and the throughput against one replica with the same cap;
- **fairness**: one saturated worker (``max_concurrent: 1``), tenants of weights 1 and 3, each sending through a
  different replica: the share each got while both waited (goal 1:3 within 10 %);
- **faults**: Redis stopped for 10 s under load and started again, then one replica SIGKILLed under load: the
  requests answered and refused, and the most the worker held at once while Redis was up.

    python bench/shared.py                  # all three
    python bench/shared.py --only caps      # caps | fairness | faults
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support.ollama_emulator import Behaviour, OllamaEmulator  # noqa: E402
from tests.support.replicas import ReplicaFleet  # noqa: E402

MODEL = "m:1"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def load(
    url: str, keys: list[str], total: int, clients: int, headers: dict[str, str] | None = None
) -> Counter[int]:
    """``total`` requests from ``clients`` clients (each its own connection), the keys taken in turn: statuses."""
    statuses: Counter[int] = Counter()
    left = iter(range(total))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def client(n: int) -> None:
            for i in left:
                key = keys[(n + i) % len(keys)]
                try:
                    async with http.post(
                        f"{url}/api/chat", json=BODY, headers={"Authorization": f"Bearer {key}", **(headers or {})}
                    ) as r:
                        await r.read()
                        statuses[r.status] += 1
                except aiohttp.ClientError:
                    statuses[0] += 1

        await asyncio.gather(*(client(n) for n in range(clients)))
    return statuses


async def create_key(url: str, headers: dict[str, str], tenant: str | None = None) -> str:
    body: dict[str, Any] = {"app": f"bench-{tenant or 'x'}-{time.monotonic_ns()}", "models": ["*"]}
    if tenant is not None:
        body["tenant"] = tenant
    async with aiohttp.ClientSession() as http, http.post(f"{url}/admin/api/keys", json=body, headers=headers) as r:
        answer = await r.json()
        if r.status >= 300:
            raise RuntimeError(f"creating a key: HTTP {r.status}: {answer}")
        return str(answer["key"])


async def caps(tmp: Path, replicas: int) -> list[str]:
    rows = []
    kinds = {
        "worker max_concurrent 2": ({"max_concurrent": 2}, {}, None),
        "tenant max_concurrent 2": ({}, {"tenants": {"t": {"max_concurrent": 2}}}, "t"),
        "model_max_concurrent 2": ({}, {"routing": {"model_max_concurrent": {MODEL: 2}}}, None),
    }
    for name, (worker_extra, sections, tenant) in kinds.items():
        figures = {}
        for count in (1, replicas):
            emu = OllamaEmulator(f"e{count}", Behaviour(models=[MODEL], tokens=4, token_delay_s=0.01))
            await emu.start()
            config = {
                "auth": {"open": False},
                "workers": [{"name": "w", "url": emu.url, "type": "ollama", **worker_extra}],
                **sections,
            }
            async with ReplicaFleet(tmp / f"caps-{len(rows)}-{count}", config, replicas=count) as fleet:
                key = await create_key(fleet.url, fleet.admin_headers, tenant)
                started = time.monotonic()
                statuses = await load(fleet.url, [key], 300, 24)
                seconds = time.monotonic() - started
            await emu.stop()
            figures[count] = (emu.peak_active, 300 / seconds, statuses)
        (peak1, rps1, s1), (peak, rps, s) = figures[1], figures[replicas]
        rows.append(
            f"| {name} | {peak1} | {peak} | {rps1:.1f} | {rps:.1f} | {rps / rps1:.2f}x | "
            f"{dict(sorted(s1.items()))} / {dict(sorted(s.items()))} |"
        )
    head = (
        f"| cap | most held at once, 1 replica | most held, {replicas} replicas | req/s, 1 replica | "
        f"req/s, {replicas} replicas | ratio | statuses (1 / {replicas}) |\n|---|---:|---:|---:|---:|---:|---|"
    )
    return [head, *rows]


async def fairness(tmp: Path, replicas: int, seconds: float) -> list[str]:
    emu = OllamaEmulator("e", Behaviour(models=[MODEL], tokens=3, token_delay_s=0.01))
    await emu.start()
    config = {
        "auth": {"open": False},
        "routing": {"queue_timeout_s": 120},
        "tenants": {"light": {"weight": 1}, "heavy": {"weight": 3}},
        "workers": [{"name": "w", "url": emu.url, "type": "ollama", "max_concurrent": 1}],
    }
    served: Counter[str] = Counter()
    async with ReplicaFleet(tmp / "fair", config, replicas=replicas) as fleet:
        keys = {t: await create_key(fleet.url, fleet.admin_headers, t) for t in ("light", "heavy")}
        urls = {"light": fleet.replicas[0].url, "heavy": fleet.replicas[1].url}
        deadline = time.monotonic() + seconds
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def client(tenant: str) -> None:
                while time.monotonic() < deadline:
                    async with http.post(
                        f"{urls[tenant]}/api/chat", json=BODY, headers={"Authorization": f"Bearer {keys[tenant]}"}
                    ) as r:
                        await r.read()
                        if r.status == 200 and time.monotonic() < deadline:
                            served[tenant] += 1

            await asyncio.gather(*(client(t) for t in ("light", "heavy") for _ in range(8)))
    await emu.stop()
    ratio = served["heavy"] / max(served["light"], 1)
    return [
        "| tenant (weight) | replica | served | share |\n|---|---|---:|---:|",
        f"| light (1) | r0 | {served['light']} | {served['light'] / max(sum(served.values()), 1):.1%} |",
        f"| heavy (3) | r1 | {served['heavy']} | {served['heavy'] / max(sum(served.values()), 1):.1%} |",
        f"\nheavy : light = {ratio:.2f} : 1 (goal 3 within 10 %: 2.7 to 3.3), {seconds:g} s, 8 clients each",
    ]


async def faults(tmp: Path, replicas: int) -> list[str]:
    emu = OllamaEmulator("e", Behaviour(models=[MODEL], tokens=4, token_delay_s=0.02))
    await emu.start()
    config = {
        "auth": {"open": False},
        "routing": {"queue_timeout_s": 60},
        "workers": [{"name": "w", "url": emu.url, "type": "ollama", "max_concurrent": 2}],
    }
    lines = []
    async with ReplicaFleet(tmp / "faults", config, replicas=replicas) as fleet:
        key = await create_key(fleet.url, fleet.admin_headers)
        assert fleet.redis is not None
        running = asyncio.ensure_future(load(fleet.url, [key], 400, 16))
        await asyncio.sleep(2)
        peak_up = emu.peak_active
        await asyncio.to_thread(fleet.redis.stop)
        await asyncio.sleep(10)
        await asyncio.to_thread(fleet.redis.start)
        statuses = await running
        served = emu.served("/api/chat")
        lines.append(
            f"Redis stopped 10 s under load (400 requests, 16 clients): statuses {dict(sorted(statuses.items()))}, "
            f"the worker answered {served}; the most it held at once before Redis stopped: {peak_up} (cap 2); "
            f"while it was away each replica held at most its share (cap 2 over {replicas} replicas: 1), so the "
            f"worker at most {replicas} at once: {emu.peak_active}"
        )
        emu.peak_active = emu.active
        before = emu.served("/api/chat")
        running = asyncio.ensure_future(load(fleet.url, [key], 400, 16))
        await asyncio.sleep(2)
        fleet.kill(2)
        statuses = await running
        lines.append(
            f"replica r2 SIGKILLed under load (400 requests, 16 clients): statuses {dict(sorted(statuses.items()))}, "
            f"the worker answered {emu.served('/api/chat') - before}; the most it held at once: {emu.peak_active} "
            "(cap 2: the dead replica's leases expired within 10 s)"
        )
    await emu.stop()
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--only", choices=("caps", "fairness", "faults"))
    parser.add_argument("--fair-seconds", type=float, default=20.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-shared-"))
    out: list[str] = []
    if args.only in (None, "caps"):
        out += ["\n### Caps\n", *await caps(tmp, args.replicas)]
    if args.only in (None, "fairness"):
        out += ["\n### Fairness\n", *await fairness(tmp, args.replicas, args.fair_seconds)]
    if args.only in (None, "faults"):
        out += ["\n### Faults\n", *await faults(tmp, args.replicas)]
    print("\n".join(out))


if __name__ == "__main__":
    asyncio.run(main())
