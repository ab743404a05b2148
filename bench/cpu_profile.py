"""Where Turnout's CPU goes under load: py-spy samples of ``turnout serve``, summed by area of the code.

Starts the mock upstream and one Turnout gateway (this checkout's src, pinned to one CPU like bench/run.py),
puts wrk load on it (``-c`` connections, non-stream or stream) and samples the gateway's main thread with
py-spy. Each sample goes to the innermost frame that belongs to an area below (so asyncio and contextlib
frames count for the code that called them); what is left is the event loop itself.

    pip install py-spy    # once, if the dev extra is not installed
    python bench/cpu_profile.py [--stream] [-c 32] [--seconds 6] [--raw out.txt] [--api /v1/responses]

``--api /v1/responses`` (or ``/v1/messages``...: any of bench/run.py's TRANSLATED) puts the load on that client API,
translated onto the mock's chat route, instead.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run as bench

AREAS = [
    ("stream frame parsing (dialects/streams)", r"turnout/dialects/streams\.py"),
    ("translation (the client API's dialect)", r"turnout/dialects/(responses|anthropic|ollama)/"),
    ("stored responses (gateway/stored)", r"turnout/gateway/stored\.py"),
    (
        "routing (dispatch, views, route, placement)",
        r"turnout/(gateway/dispatch|core/(routing|placement|patterns|names))",
    ),
    (
        "key, limits, usage accounting",
        r"turnout/(gateway/(accounting|limiter|shared_limits)|store/|core/(latency|limits))",
    ),
    ("metrics (prometheus)", r"(prometheus_client|turnout/metrics\.py)"),
    ("access log", r"turnout/(gateway/access|redaction)\.py|logging/__init__"),
    ("request parsing (read_call)", r"turnout/gateway/calls\.py"),
    ("upstream client (turnout/upstream)", r"turnout/upstream/"),
    ("proxy logic (gateway/proxy, fleet state and health)", r"turnout/(gateway/proxy|fleet/|core/health)"),
    ("handler and middleware (routes, app, server, peers)", r"turnout/gateway/(routes|app|server|peers)\.py"),
    ("aiohttp server (HTTP parsing, request/response objects, writes)", r"(aiohttp|multidict|yarl|aiosignal)/"),
]


def summarise(raw: Path) -> tuple[int, list[tuple[str, int]]]:
    """(main-thread samples, [(area, samples)] largest first) from py-spy's raw (collapsed) output."""
    areas = [(name, re.compile(pattern)) for name, pattern in AREAS]
    tally: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Runner.run" not in stack:  # worker threads (the store's, idle ones) are not the request path
            continue
        n = int(count)
        total += n
        for frame in reversed(stack.split(";")):
            area = next((name for name, pattern in areas if pattern.search(frame)), None)
            if area is not None:
                tally[area] += n
                break
        else:
            tally["event loop (uvloop, asyncio tasks)"] += n
    return total, tally.most_common()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", action="store_true", help="64-chunk SSE streams instead of plain answers")
    parser.add_argument("-c", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--seconds", type=float, default=6.0, help="load and sampling time (default 6)")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw samples here")
    parser.add_argument("--native", action="store_true", help="sample C frames too (py-spy --native)")
    parser.add_argument("--api", choices=["chat", *bench.TRANSLATED], default="chat", help="the client API loaded")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        sys.exit("py-spy is missing: pip install py-spy")
    wrk, pin, load = bench.pinned_wrk()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-profile-"))
    raw = args.raw or tmp / "samples.txt"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_url = bench.start_mock(procs, load)
        target = bench.start_turnout("turnout", tmp / "turnout", mock_url, procs, None, cpus=pin)
        bench.wait_ready(target.url, target.proc, target.key)
        if args.api != "chat":
            target.path, target.body = bench.TRANSLATED[args.api]
        assert target.proc is not None
        # --nonblocking: a paused process stops at its next entry to the kernel, so pausing to sample would
        # pile the samples onto the lines just after system calls (getpid in get_running_loop, socket writes)
        record = [spy, "record", "-r", "250", "-d", f"{args.seconds + 2:g}", "-f", "raw", "--nonblocking"]
        if args.native:
            record.append("--native")
        sampler = subprocess.Popen(
            [*record, "-o", str(raw), "-p", str(target.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.5)  # py-spy attaches
        got = bench.run_wrk(wrk, target, args.stream, args.c, args.seconds, tmp, mock_url)
        sampler.wait(args.seconds + 30)
    finally:
        bench.stop_all(procs)
    total, areas = summarise(raw)
    mode = "stream (64 SSE chunks)" if args.stream else "non-stream"
    print(
        f"\n{target.path} {mode}, c={args.c}: {got['rps']:.0f} req/s, {bench._us(got):.0f} us CPU per request, "
        f"{total} samples"
    )
    print("\n| area | share of the gateway's main thread |\n|---|---:|")
    for name, n in areas:
        print(f"| {name} | {100 * n / total:.0f}% |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
