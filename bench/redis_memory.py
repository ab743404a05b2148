"""What the shared prefix index costs Redis: 16 workers, each index filled to ``routing.prefix_max_blocks``.

The index is written by the gateway's own code (:class:`turnout.gateway.redis_occupancy.RedisOccupancy`'s take, the
script every routed request runs), on Debian's redis-server on a loopback port: prompts of ``--prompt-kib`` KiB,
distinct per conversation, each with a session name, sent to the workers in turn until every worker was sent
``--fill`` times its index's bound of blocks. Redis's ``used_memory`` is read before and after (and its keys'
``MEMORY USAGE`` by kind), with the slots given back (what stays is the index alone).

    python bench/redis_memory.py                     # 16 workers, the default bounds (16384 blocks of 256 bytes)
    python bench/redis_memory.py --workers 4 --max-blocks 4096
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support.services import RedisServer  # noqa: E402

from turnout.core.admission import Caps, Priority  # noqa: E402
from turnout.core.prefix import prompt_of  # noqa: E402
from turnout.gateway.occupancy import Grant, next_id  # noqa: E402
from turnout.gateway.redis_occupancy import RedisOccupancy  # noqa: E402

BLOCK = 256


async def fill(url: str, workers: int, max_blocks: int, max_sessions: int, prompt_kib: int, times: float) -> int:
    """Send prompts to every worker until each was sent ``times`` x ``max_blocks`` blocks; the prompts sent."""
    occupancy = RedisOccupancy(
        url,
        timeout_s=2.0,
        index=lambda _: None,
        tenant_caps={},
        max_blocks=max_blocks,
        max_sessions=max_sessions,
        prefix_ttl_s=600,
    )
    await occupancy.start()
    per_prompt = prompt_kib * 1024 // BLOCK
    rounds = int(max_blocks * times) // per_prompt + 1
    sent = 0
    try:
        for r in range(rounds):
            grants = []
            for w in range(workers):
                text = f"conversation {r}-{w} " * (prompt_kib * 1024 // 20)
                prompt = prompt_of([text[: prompt_kib * 1024]], BLOCK, "m:1", session=f"s{r}-{w}")
                grant = Grant(next_id("l"), f"w{w}", "m:1", "t", Priority.STANDARD, Caps(), prompt)
                grants.append(grant)
            refused = await asyncio.gather(*(occupancy.take(g) for g in grants))
            assert not any(refused), refused
            for g in grants:
                occupancy.give(g)
            await occupancy.settle()
            sent += len(grants)
    finally:
        await occupancy.close()
    return sent


async def run(args: argparse.Namespace) -> None:
    import redis

    server = RedisServer()
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        before = int(client.info("memory")["used_memory"])
        sent = await fill(server.url, args.workers, args.max_blocks, args.max_sessions, args.prompt_kib, args.fill)
        after = int(client.info("memory")["used_memory"])
        kinds: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for key in client.scan_iter(count=1000):
            kind = key.decode().split(":")[1]
            kinds[kind] += int(client.memory_usage(key) or 0)
            counts[kind] += 1
        px = [int(client.zcard(f"turnout:px:w{w}")) for w in range(args.workers)]
        print(f"{args.workers} workers, prefix_max_blocks {args.max_blocks}, {sent} prompts of {args.prompt_kib} KiB")
        print(f"blocks held per worker: min {min(px)}, max {max(px)}")
        print(f"used_memory: {before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB after")
        mib = (after - before) / 2**20
        print(f"the index: {mib:.1f} MiB in all, {mib / args.workers:.2f} MiB per worker")
        for kind, size in kinds.most_common():
            print(f"  {kind:>6}: {counts[kind]:3d} keys, {size / 2**20:7.2f} MiB (MEMORY USAGE)")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--max-blocks", type=int, default=16384, help="routing.prefix_max_blocks")
    parser.add_argument("--max-sessions", type=int, default=4096)
    parser.add_argument("--prompt-kib", type=int, default=16)
    parser.add_argument("--fill", type=float, default=1.5, help="blocks sent per worker, times its bound")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
