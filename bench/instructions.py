"""Instructions per request, counted by valgrind's callgrind: a measure of what a change costs the request path that
the machine's load cannot move (``bench/ab.py``'s CPU time moves by several percent between runs on a shared
machine; see "Where the time went (issue 34)" in bench/README.md).

For each source tree: N requests, one at a time, through a gateway built in process (``create_app``, served on
loopback) by an aiohttp client in the same process, against the mock upstream (``bench/mock_upstream.py``, another
process, not counted); run for a small and a large N, the difference divided by the difference of N is one
request's instructions, start-up taken out (and what start-up left in memory frozen out of the garbage collector's
full passes, which would otherwise land in one run and not the other). The same client against the mock directly
gives the client's share, taken out too: what is left is the gateway's.

    apt-get install valgrind    # once (the script does it as root)
    python bench/instructions.py /tmp/base/src src [--stream] [--small 100] [--large 600]

A run takes a few minutes per tree (callgrind runs Python about 50 times slower).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run as bench

_COLLECTED = re.compile(r"Collected : (\d+)")
_WARM_UP = 20


async def _requests(src: str | None, n: int, port: int, stream: bool) -> None:
    """The measured process: ``n`` chat completions through a gateway of ``src`` (None: to the mock directly)."""
    import aiohttp
    from aiohttp import web

    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    target = f"http://127.0.0.1:{port}"
    runner = None
    if src is not None:
        from turnout.config import load_settings
        from turnout.gateway.server import start_runner
        from turnout.wiring import create_app

        tmp = Path(tempfile.mkdtemp(prefix="turnout-instr-"))
        config = {
            "storage": {"data_dir": str(tmp / "data")},
            "auth": {"open": True},
            "health": {"interval_s": 3600},
            "workers": [{"name": "mock", "url": target, "type": "openai"}],
        }
        (tmp / "config.json").write_text(json.dumps(config))
        runner = await start_runner(create_app(load_settings(tmp / "config.json", env={}), admin_token="bench"))
        gateway_port = bench.free_port()
        await web.TCPSite(runner, "127.0.0.1", gateway_port).start()
        target = f"http://127.0.0.1:{gateway_port}"
    async with aiohttp.ClientSession() as http:

        async def call() -> None:
            async with http.post(f"{target}/v1/chat/completions", json=body) as r:
                await r.read()
                if r.status != 200:
                    sys.exit(f"HTTP {r.status}: {await r.text()}")

        for _ in range(_WARM_UP):  # (caches filled, connections pooled: the same in both runs)
            await call()
        # What start-up left is kept out of the collector's full passes, which would otherwise land in one run and
        # not the other (one scan of the whole heap is millions of instructions)
        gc.collect()
        gc.freeze()
        for _ in range(n):
            await call()
    if runner is not None:
        await runner.cleanup()


def _count(src: str | None, n: int, port: int, stream: bool) -> int:
    """Instructions of one measured process (callgrind's ``Collected``)."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    cmd += ["--measure", src or "-", str(n), str(port), *(["--stream"] if stream else [])]
    env = {**os.environ, "PYTHONPATH": src} if src is not None else dict(os.environ)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        sys.exit(f"callgrind failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        src, n, port = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        if src != "-":
            sys.path.insert(0, src)
        asyncio.run(_requests(None if src == "-" else src, n, port, "--stream" in sys.argv))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("srcs", nargs="+", type=Path, help="source trees (each a checkout's src directory)")
    parser.add_argument("--stream", action="store_true", help="64-chunk SSE streams instead of plain answers")
    parser.add_argument("--small", type=int, default=100, help="requests of the short run (default 100)")
    parser.add_argument("--large", type=int, default=600, help="requests of the long run (default 600)")
    args = parser.parse_args()
    bench.ensure_deb("valgrind", "valgrind")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_url = bench.start_mock(procs, None)
        port = int(mock_url.rsplit(":", 1)[1])
        span = args.large - args.small

        def per_request(src: str | None) -> float:
            return (_count(src, args.large, port, args.stream) - _count(src, args.small, port, args.stream)) / span

        client = per_request(None)
        results = [(src, per_request(str(src.resolve())) - client) for src in args.srcs]
    finally:
        bench.stop_all(procs)
    mode = "stream (64 SSE chunks)" if args.stream else "non-stream"
    print(f"\n{mode}: instructions per request, the gateway's (the client's {client:,.0f} taken out)\n")
    first = results[0][1]
    for src, count in results:
        print(f"{count:12,.0f}  {count / first - 1:+7.2%}  {src}")


if __name__ == "__main__":
    main()
