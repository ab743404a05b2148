"""Interactive requests behind a batch backlog, with and without priority classes, in one run.

One worker with one slot (``max_concurrent: 1``; the Ollama protocol emulator of ``tests/support``, each answer
``--tokens`` tokens ``--token-ms`` apart, so one request holds the slot for a known time). A batch client keeps
``--backlog`` requests waiting (that many loops, each sending its next request when the last is answered); meanwhile
an interactive client sends ``--interactive`` requests one after another, ``--pause-ms`` apart. Both go through the
gateway's full path (keys, limits, the dispatcher's queue, usage) of an in-process gateway.

- **classes**: the batch client's key is ``batch``, the interactive client's ``interactive``: each interactive
  request waits for the slot to be given back once, at most;
- **equal**: both keys ``standard`` (as before priority classes): each interactive request waits behind the
  whole backlog still queued.

Printed per scenario: the interactive requests' time to answer p50 and max, and the batch requests answered per
second meanwhile (the slot stays busy: batch takes what interactive leaves).

    python bench/priority.py          # --backlog 30 --interactive 10 --pause-ms 200 --tokens 5 --token-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.conftest import serve_gateway  # noqa: E402
from tests.support.ollama_emulator import Behaviour, OllamaEmulator  # noqa: E402

from turnout.config import load_settings  # noqa: E402
from turnout.core.admission import Priority  # noqa: E402
from turnout.gateway.keys import DISPATCHER, KEYS  # noqa: E402
from turnout.wiring import create_app  # noqa: E402


async def scenario(tmp: Path, classes: bool, args: argparse.Namespace) -> tuple[list[float], float]:
    """(the interactive requests' seconds to answer, the batch requests answered per second meanwhile)."""
    emu = OllamaEmulator("w", Behaviour(models=["m:1"], tokens=args.tokens, token_delay_s=args.token_ms / 1000))
    await emu.start()
    config = tmp / f"config-{classes}.json"
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": str(tmp / f"data-{classes}")},
                "health": {"interval_s": 3600, "timeout_s": 2},
                "routing": {"queue_timeout_s": 600},
                "workers": [{"name": "w", "url": emu.url, "type": "ollama", "max_concurrent": 1}],
            }
        )
    )
    app = create_app(load_settings(config, env={}), admin_token="bench")
    url, runner = await serve_gateway(app)
    try:
        keys = app[KEYS]

        def key(app_name: str, priority: Priority) -> str:
            made = keys.create(
                app=app_name,
                tenant=None,
                scopes=["*"],
                rpm=None,
                daily_tokens=None,
                expires_at=None,
                now=time.time(),
                priority=priority if classes else None,
            )
            return made[1]

        batch_key, interactive_key = key("nightly", Priority.BATCH), key("chat", Priority.INTERACTIVE)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def ask(key_text: str, n: int) -> float:
                body = {"model": "m:1", "messages": [{"role": "user", "content": f"q{n}"}], "stream": False}
                started = time.perf_counter()
                headers = {"Authorization": f"Bearer {key_text}"}
                async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                return time.perf_counter() - started

            stop = asyncio.Event()
            done = 0

            async def batch_client(n: int) -> None:  # one of --backlog loops: a script that keeps the queue full
                nonlocal done
                while not stop.is_set():
                    await ask(batch_key, n)
                    done += 1

            backlog = [asyncio.create_task(batch_client(n)) for n in range(args.backlog)]
            for _ in range(3000):  # at most 30 s: the backlog queued behind the one running
                if app[DISPATCHER].waiting >= args.backlog - 1:
                    break
                await asyncio.sleep(0.01)
            began, before = time.perf_counter(), done
            interactive = []
            for n in range(args.interactive):  # a person: a question, the answer, a pause
                interactive.append(await ask(interactive_key, n))
                await asyncio.sleep(args.pause_ms / 1000)
            elapsed = time.perf_counter() - began
            batch_rate = (done - before) / elapsed
            stop.set()
            await asyncio.gather(*backlog)
            return interactive, batch_rate
    finally:
        await runner.cleanup()
        await emu.stop()


async def main(args: argparse.Namespace) -> None:
    service_ms = args.tokens * args.token_ms
    print(f"one slot; each answer about {service_ms:g} ms; {args.backlog} batch requests kept waiting")
    print(f"{'scenario':<10} {'interactive p50':>16} {'interactive max':>16} {'batch answers/s':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        for classes in (True, False):
            waits, rate = await scenario(Path(tmp), classes, args)
            name = "classes" if classes else "equal"
            p50, most = statistics.median(waits), max(waits)
            print(f"{name:<10} {p50 * 1000:>13.0f} ms {most * 1000:>13.0f} ms {rate:>16.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=30)
    parser.add_argument("--interactive", type=int, default=10)
    parser.add_argument("--pause-ms", type=float, default=200.0)
    parser.add_argument("--tokens", type=int, default=5)
    parser.add_argument("--token-ms", type=float, default=20.0)
    asyncio.run(main(parser.parse_args()))
