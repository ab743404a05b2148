"""Two (or more) Turnout source trees side by side: CPU per request of each, in one run.

Starts the mock upstream and one `turnout serve` per source tree (its ``src``, e.g. a `git worktree` of an
earlier commit), each pinned to the same CPU as ``bench/run.py`` pins a proxy, and runs wrk against them in
turn, round after round, so that the machine's drift hits every tree alike. Prints the median CPU per request
(utime+stime from /proc over the requests wrk completed) and each round's figure; this is how the changes in
bench/README.md were judged one by one.

    git worktree add /tmp/base HEAD~1
    python bench/ab.py /tmp/base/src src [--stream] [--rounds 5] [--level info] [-c 32] [-d 3] [--traces]

``--traces`` runs each tree a second time with OpenTelemetry traces on (``telemetry.otlp_endpoint``; the mock
upstream takes the spans as a collector would), for trees that have them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run as bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("srcs", nargs="+", type=Path, help="source trees (each a checkout's src directory)")
    parser.add_argument("--stream", action="store_true", help="64-chunk SSE streams instead of plain answers")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the trees interleaved (default 5)")
    parser.add_argument("--level", default="warning", help="--log-level of the gateways (info: access log on)")
    parser.add_argument("-c", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("-d", type=float, default=3.0, help="seconds per run (default 3)")
    parser.add_argument(
        "--traces",
        action="store_true",
        help="also run each tree with traces on (telemetry.otlp_endpoint: the mock takes the spans)",
    )
    args = parser.parse_args()
    for src in args.srcs:
        if not (src / "turnout" / "__init__.py").is_file():
            sys.exit(f"{src} is not a source tree with turnout in it (give a checkout's src directory)")
    wrk, pin, load = bench.pinned_wrk()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-ab-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_url = bench.start_mock(procs, load)
        targets = []
        runs: list[tuple[Path, dict[str, Any] | None]] = [(src, None) for src in args.srcs]
        if args.traces:
            traces = {"telemetry": {"otlp_endpoint": f"{mock_url}/v1/traces"}}
            runs += [(src, traces) for src in args.srcs]
        for n, (src, extra) in enumerate(runs):
            target = bench.start_turnout(
                f"tree {n}", tmp / f"t{n}", mock_url, procs, str(src), args.level, pin, config_extra=extra
            )
            bench.wait_ready(target.url, target.proc, target.key)
            targets.append(target)
        results: list[list[float]] = [[] for _ in targets]
        for _ in range(args.rounds):
            for target, got in zip(targets, results, strict=True):
                cell = bench.run_wrk(wrk, target, args.stream, args.c, args.d, tmp, mock_url)
                if cell["errors"] or cell["reached"] < 0.99:
                    sys.exit(f"{target.name}: {cell['errors']} errors, reached {cell['reached']:.2f}: not comparable")
                got.append(bench._us(cell))
    finally:
        bench.stop_all(procs)
    mode = "stream (64 SSE chunks)" if args.stream else "non-stream"
    print(f"\n{mode}, c={args.c}, {args.rounds} rounds of {args.d:g} s, --log-level {args.level}\n")
    for (src, extra), got in zip(runs, results, strict=True):
        name = f"{src} + traces" if extra else str(src)
        print(f"{statistics.median(got):7.1f} us CPU/req  {name}  (rounds: {', '.join(f'{x:.0f}' for x in got)})")


if __name__ == "__main__":
    main()
