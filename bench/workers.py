"""`turnout serve --workers N`: one gateway process against two, in one run, in front of the same mock upstream.

    python -m bench.workers [--duration 3] [--rounds 3] [--concurrency 32] [--processes 1,2] [--no-limited]

Each row is a Turnout gateway on its full path (a scoped app key, limits, routing, placement, usage, metrics);
"rpm key" rows use a key with a requests-per-minute limit high enough never to refuse, so that the limit is
checked on every request: in memory with one process, by the supervisor (one message and its answer per
request, turnout.gateway.shared_limits) with several. Nothing is pinned: with two processes the gateway may
use both cores, and wrk and the mock share them. On a 2-core machine that caps req/s, so the figure to judge
is requests per proxy CPU-second: utime+stime of the whole gateway (supervisor and every process) from /proc
over the measured seconds, divided into the requests wrk completed; "vs 1 process" compares it with the
one-process row of the same key kind and cell.
Needs wrk (installed with apt-get by bench/run.py's helper when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import Target, ensure_deb, rss_mib, run_wrk, start_mock, start_turnout, stop_all, wait_ready

__all__ = ["main"]


def start_gateway(
    home: Path, mock_url: str, processes: int, rpm: int | None, procs: list[subprocess.Popen[bytes]]
) -> tuple[Target, list[str]]:
    kind = "rpm key" if rpm is not None else "plain key"
    name = f"{processes} process{'es' if processes > 1 else ''}, {kind}"
    target = start_turnout(name, home, mock_url, procs, None, processes=processes, rpm=rpm)
    return target, [kind, str(processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, targets interleaved; medians reported")
    parser.add_argument("--concurrency", default="32")
    parser.add_argument("--processes", default="1,2", help="gateway process counts to compare (default 1,2)")
    parser.add_argument("--no-limited", action="store_true", help="leave out the rows with an rpm-limited key")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.processes.split(",")]
    wrk = [ensure_deb("wrk", "wrk")]
    tmp = Path(tempfile.mkdtemp(prefix="turnout-bench-workers-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_url = start_mock(procs)
        targets: list[tuple[Target, list[str]]] = []
        for rpm in [None] if args.no_limited else [None, 1_000_000_000]:
            for n in counts:
                target, meta = start_gateway(tmp / f"g{len(targets)}", mock_url, n, rpm, procs)
                targets.append((target, meta))
        for t, _ in targets:
            wait_ready(t.url, t.proc, t.key)
        samples: dict[tuple[str, bool, int], list[dict[str, float]]] = {}
        for round_no in range(1, args.rounds + 1):
            for stream in (False, True):
                for conns in levels:
                    for t, _ in targets:
                        got = run_wrk(wrk, t, stream, conns, args.duration, tmp, mock_url)
                        samples.setdefault((t.name, stream, conns), []).append(got)
                        print(
                            f"  round {round_no} {t.name:26} stream={stream!s:5} c={conns:<3} {got['rps']:8.0f} req/s"
                            f" {_per_cpu_s(got):8.0f} req/CPU-s reached {got['reached']:.2f}",
                            file=sys.stderr,
                        )
        memory = {t.name: rss_mib(t.proc) for t, _ in targets}
        print(
            f"\nwrk -t1, {args.duration:g}s per cell, median of {args.rounds} interleaved rounds, mock upstream, "
            f"{os.cpu_count()} CPUs shared by wrk, the mock and the gateway, {time.strftime('%Y-%m-%d')}\n"
        )
        print(
            "| mode | c | key | processes | req/s | p50 ms | p99 ms | errors | reached | CPU us/req | req/CPU-s "
            "| per CPU-s vs 1 process | req/s vs 1 process | RSS MiB (all) |"
        )
        print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for stream in (False, True):
            for conns in levels:
                rows = {}
                for t, _meta in targets:
                    runs = samples[(t.name, stream, conns)]
                    rows[t.name] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
                    rows[t.name]["per_cpu"] = statistics.median(_per_cpu_s(r) for r in runs)
                    rows[t.name]["reached"] = min(r["reached"] for r in runs)
                    rows[t.name]["errors"] = sum(r["errors"] for r in runs)
                for t, (kind, n) in targets:
                    r = rows[t.name]
                    one = (
                        next(rows[o.name] for o, m in targets if m == [kind, "1"]) if "1" in map(str, counts) else None
                    )
                    vs_cpu = f"{r['per_cpu'] / one['per_cpu']:.2f}x" if one and one["per_cpu"] else "-"
                    vs_rps = f"{r['rps'] / one['rps']:.2f}x" if one and one["rps"] else "-"
                    mode = "stream (64 SSE chunks)" if stream else "non-stream"
                    mib = memory[t.name]
                    print(
                        f"| {mode} | {conns} | {kind} | {n} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                        f"{r['errors']:.0f} | {r['reached']:.2f} | {1e6 / r['per_cpu']:.0f} | {r['per_cpu']:.0f} | "
                        f"{vs_cpu} | {vs_rps} | {'-' if mib is None else f'{mib:.0f}'} |"
                    )
    finally:
        stop_all(procs, 30)  # a gateway of several processes drains them all
        shutil.rmtree(tmp, ignore_errors=True)


def _per_cpu_s(run: dict[str, float]) -> float:
    """Requests per CPU-second of the whole gateway (0 when it used none: nothing measured)."""
    return run["requests"] / run["cpu"] if run["cpu"] else 0.0


if __name__ == "__main__":
    main()
