"""Picking a worker, per request, as the fleet grows: the dispatcher's acquire + release, in process.

Builds the gateway (``create_app``) with a fleet of N healthy OpenAI-style workers that all hold the model
(nothing is dialed: the fleet state is set directly) and times ``Dispatcher.acquire`` + ``Lease.release``,
which run the views of the fleet (``Fleet.views``), placement and scoring (``core.routing.route``) and the
slot counters, on every proxied request. ``--baseline SRC`` runs the same in another source tree (e.g. the
``src`` of a git worktree of an earlier commit), in its own interpreter, for a side-by-side table.

    python bench/routing.py [--workers 1,4,16] [--baseline /tmp/base/src] [--prompt-tokens 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-model"


def measure(workers: int, n: int, prompt_tokens: int = 0) -> float:
    """Microseconds per acquire + release with ``workers`` workers (the best of five passes of ``n``); with
    ``prompt_tokens``, each request carries a chat prompt that long (prefix routing: cut, hashed, matched against
    every worker's index and recorded; trees from before it ignore it)."""
    from turnout.config import Settings
    from turnout.gateway.keys import DISPATCHER, FLEET
    from turnout.wiring import create_app

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.model_validate(
            {
                "storage": {"data_dir": str(Path(tmp) / "data")},
                "routing": {"max_concurrent": 4096},
                "workers": [
                    {"name": f"w{i}", "url": f"http://127.0.0.1:{20000 + i}", "type": "openai"} for i in range(workers)
                ],
            }
        )
        app = create_app(settings, admin_token="bench")
        fleet, dispatcher = app[FLEET], app[DISPATCHER]
        for i, state in enumerate(fleet.workers.values()):
            state.healthy = True
            state.inventory = frozenset({MODEL})
            if hasattr(state, "speed"):  # a tree from before learned prefill and decode rates
                state.speed[MODEL] = 10.0 + i  # scoring has something to weigh
            else:
                from turnout.fleet.state import Learned

                now = time.monotonic()
                learned = state.learned[MODEL] = Learned(500.0 + i, now + 3600, 10.0 + i, now + 3600, 1.0, now + 3600)
                if hasattr(learned, "company"):  # how much its slots slow each other, learned (turnout.core.sharing)
                    learned.company = {0: (0.1, 100.0, 20, now + 3600), 1: (1.0, 55.0, 20, now + 3600)}
        ask = None
        if prompt_tokens and "ask" in inspect.signature(dispatcher.acquire).parameters:
            from turnout.dialects.base import Call, Dialect, Endpoint
            from turnout.gateway.dispatch import Ask

            text = "You are a bench assistant. " * (prompt_tokens * 4 // 27)
            payload = {
                "model": MODEL,
                "messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}],
            }
            ask = Ask(Call(Dialect.OPENAI, Endpoint.CHAT, "/v1/chat/completions", b"{}", payload, MODEL, False), {})

        async def passes() -> float:
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(n):
                    if ask is None:
                        (await dispatcher.acquire(MODEL)).release()
                    else:
                        ask._done = False  # each request's prompt is cut and hashed anew
                        (await dispatcher.acquire(MODEL, ask=ask)).release()
                best = min(best, (time.perf_counter() - started) / n * 1e6)
            return best

        return asyncio.run(passes())


def run_in(src: str, workers: list[int], n: int, prompt_tokens: int = 0) -> dict[int, float]:
    """The same measurement in another source tree, in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": f"{Path(src).resolve()}{os.pathsep}{ROOT}"}
    code = (
        "import json, sys; from bench.routing import measure; "
        f"print(json.dumps({{w: measure(w, {n}, {prompt_tokens}) for w in {workers!r}}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,4,16", help="fleet sizes, comma-separated")
    parser.add_argument("--requests", type=int, default=5000, help="acquires per pass (five passes, best kept)")
    parser.add_argument("--baseline", metavar="SRC", help="also measure this source tree, side by side")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="a chat prompt this long on each request")
    args = parser.parse_args()
    sizes = [int(w) for w in args.workers.split(",")]
    ours = run_in(str(ROOT / "src"), sizes, args.requests, args.prompt_tokens)
    base = run_in(args.baseline, sizes, args.requests, args.prompt_tokens) if args.baseline else None
    print("\nDispatcher.acquire + Lease.release per request (us, best of 5 passes), every worker holding the model\n")
    if base is None:
        print("| workers | us/request |\n|---:|---:|")
        for w in sizes:
            print(f"| {w} | {ours[w]:.1f} |")
        return
    print("| workers | this tree | baseline | this / baseline |\n|---:|---:|---:|---:|")
    for w in sizes:
        print(f"| {w} | {ours[w]:.1f} | {base[w]:.1f} | {ours[w] / base[w]:.2f}x |")


if __name__ == "__main__":
    main()
