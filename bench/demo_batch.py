"""The demo model's interactive turns beside a batch: what a user of the quick start meets when a Batch API job
runs on the one engine `./scripts/serve` starts (SmolLM2-135M on llama.cpp's own server, one slot, one thread).

Each round starts `turnout serve` (a subprocess, as a user runs it) on a fresh data dir whose config has the demo
entry only, for each source tree (this checkout's, and ``--src`` trees, e.g. a worktree of an earlier commit:
side by side, in rotating order), and with the starter key the first start prints:

1. **alone**: ``--turns`` short chat turns, one after another (a one-line question, ``--max-tokens`` tokens,
   streamed, a pause of ``--pause-s`` between), each timed by the client from sending to the first event with
   text (the official ``openai`` SDK);
2. **beside a batch**: ``--lines`` chat lines uploaded and created with the same key (``files.create``,
   ``batches.create``), then the same turns while the batch runs; then the batch is cancelled.

Printed per tree, over every round: the turns' time to first token p50 and p90 alone and beside the batch, their
ratio, the lines stopped for them (``turnout_preempted_requests_total``) and the batch's lines answered meanwhile.

    python bench/demo_batch.py                          # this tree, 3 rounds
    python bench/demo_batch.py --src /tmp/base/src      # and an earlier tree, side by side

Prints the machine's load average before and after: the figures depend on what else runs.
"""

from __future__ import annotations

import argparse
import io
import json
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.demo import READY, free_port, load, spawn_serve, wait_line  # noqa: E402
from bench.prefix import pct  # noqa: E402


def turns(client: openai.OpenAI, count: int, max_tokens: int, pause_s: float, tag: str) -> list[float]:
    """``count`` streamed turns, one after another: each one's seconds to its first text."""
    out = []
    for n in range(count):
        sent = time.monotonic()
        stream = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": f"In one sentence, what is {tag} number {n}?"}],
            max_tokens=max_tokens,
            stream=True,
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - sent
        out.append(first if first is not None else time.monotonic() - sent)
        time.sleep(pause_s)
    return out


def stopped(url: str) -> float:
    """The lines stopped for other requests so far (the gateway's /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("turnout_preempted_requests_total "):
                return float(line.split()[1])
    return 0.0


def one_round(src: Path, args: argparse.Namespace, rows: dict[str, list[float]]) -> None:
    work = Path(tempfile.mkdtemp(prefix="turnout-demo-batch-"))
    port = free_port()
    (work / "config.json").write_text(
        json.dumps(
            {"listen": {"port": port}, "storage": {"data_dir": "data"}, "workers": [{"name": "demo", "type": "demo"}]}
        )
    )
    proc = spawn_serve(work / "config.json", src, work)
    seen: list[str] = []
    try:
        wait_line(proc, READY, 180, seen)
        key = next(line.strip() for line in seen if line.strip().startswith("tk_"))
        url = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        turns(client, 2, args.max_tokens, args.pause_s, "warm-up")
        rows["alone"] += turns(client, args.turns, args.max_tokens, args.pause_s, "a city")
        lines = [
            {
                "custom_id": f"line-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "smollm2-135m",
                    "messages": [{"role": "user", "content": f"Write about the number {n}."}],
                    "max_tokens": args.max_tokens,
                },
            }
            for n in range(args.lines)
        ]
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        before = stopped(url)
        time.sleep(2)  # the batch at work
        rows["beside"] += turns(client, args.turns, args.max_tokens, args.pause_s, "a river")
        rows["stopped"].append(stopped(url) - before)
        counts = client.batches.retrieve(batch.id).request_counts
        rows["answered"].append(float(counts.completed if counts else 0))
        client.batches.cancel(batch.id)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", default=[], help="another source tree (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--pause-s", type=float, default=0.5)
    args = parser.parse_args()
    trees = [ROOT / "src", *(Path(s).resolve() for s in args.src)]
    rows: dict[str, dict[str, list[float]]] = {
        str(t): {"alone": [], "beside": [], "stopped": [], "answered": []} for t in trees
    }
    print(f"load average before: {load()}")
    for n in range(args.rounds):
        for tree in trees[n % len(trees) :] + trees[: n % len(trees)]:
            one_round(tree, args, rows[str(tree)])
            got = rows[str(tree)]
            alone, beside = pct(got["alone"], 0.5), pct(got["beside"], 0.5)
            print(f"round {n + 1} {tree}: alone p50 {alone:.3f} s, beside p50 {beside:.3f} s")
    print(f"load average after: {load()}")
    print(
        "| tree | turns | TTFT alone p50 / p90 s | beside a batch p50 / p90 s | ratio p50 / p90 | lines stopped "
        "| lines answered |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, got in rows.items():
        a50, a90, b50, b90 = (pct(got[k], q) for k in ("alone", "beside") for q in (0.5, 0.9))
        print(
            f"| {name} | {len(got['alone'])} | {a50:.3f} / {a90:.3f} | {b50:.3f} / {b90:.3f} | "
            f"{b50 / a50:.2f}x / {b90 / a90:.2f}x | {sum(got['stopped']):.0f} | {sum(got['answered']):.0f} |"
        )


if __name__ == "__main__":
    main()
