"""How soon llama-server gives a slot back when the client of the request in it goes away: streamed or not.

What a gateway that preempts a running request (a batch line in the way of an interactive one) can count on: on a
one-slot engine the next request starts only once the engine stops the one whose client disconnected. One engine
of bench/fleet.py (SmolLM2-135M, one slot, one thread); a long answer (``--max-tokens``, ``ignore_eos``) is asked
for, its connection closed after ``--cut-s``, and a one-token request sent at once: its time is how long the slot
stayed taken. Each trial waits for the long answer's time after, so that nothing of it is left.

    python bench/slot_release.py        # --trials 3 --cut-s 0.3 --max-tokens 600
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fleet


def _send(port: int, body: dict[str, object]) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn


def _timed(port: int, body: dict[str, object]) -> float:
    """Seconds until the whole answer is read."""
    started = time.perf_counter()
    conn = _send(port, body)
    try:
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
    finally:
        conn.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cut-s", type=float, default=0.3, help="how long the long answer runs before its client goes")
    parser.add_argument("--max-tokens", type=int, default=600)
    args = parser.parse_args()
    short = {"model": fleet.ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    long = {**short, "max_tokens": args.max_tokens, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as tmp:
        (engine,) = fleet.start(1, Path(tmp), parallel=1, n_ctx=args.max_tokens + 64, opaque=False)
        try:
            port = int(engine.own_url.rsplit(":", 1)[1])
            alone = [_timed(port, short) for _ in range(args.trials)]
            whole = _timed(port, long)
            rows = []
            for stream in (False, True):
                waits = []
                for _ in range(args.trials):
                    conn = _send(port, {**long, "stream": stream})
                    time.sleep(args.cut_s)
                    conn.close()  # the client goes: its socket is closed
                    waits.append(_timed(port, short))
                    time.sleep(whole)  # nothing of the long answer is left, whether it was stopped or not
                rows.append((f"after a {'streamed' if stream else 'non-streamed'} answer's client went", waits))
        finally:
            engine.stop()
    print(f"one slot; the long answer: {args.max_tokens} tokens, {whole:.2f} s; its client goes after {args.cut_s} s")
    print("| one-token request | median s | max s |\n|---|---:|---:|")
    for label, waits in [("alone", alone), *rows]:
        print(f"| {label} | {statistics.median(waits):.3f} | {max(waits):.3f} |")


if __name__ == "__main__":
    main()
