"""Two (or more) Turnout source trees side by side: CPU per request of each, in one run.

Starts the mock upstream and one `turnout serve` per source tree (its ``src``, e.g. a `git worktree` of an
earlier commit), each pinned to the same CPU as ``bench/run.py`` pins a proxy, and runs wrk against them in
turn, round after round, so that the machine's drift hits every tree alike. Prints the median CPU per request
(utime+stime from /proc over the requests wrk completed) and each round's figure; this is how the changes in
bench/README.md were judged one by one.

    git worktree add /tmp/base HEAD~1
    python bench/ab.py /tmp/base/src src [--stream] [--rounds 5] [--level info] [-c 32] [-d 3] [--traces]
    python bench/ab.py src --shared     # the tree alone and with storage.redis_url (a redis-server of its own)

``--shared``: each tree also runs with the replicas' shared state in Redis (the requests in flight, the queue, the
rate limits), and the Redis commands it sends per request are counted (Redis's own ``total_commands_processed``).
``--traces`` runs each tree a second time with OpenTelemetry traces on (``telemetry.otlp_endpoint``; the mock
upstream takes the spans as a collector would), for trees that have them.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    parser.add_argument("--shared", action="store_true", help="each tree with storage.redis_url too (see above)")
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
    redis_url = None
    try:
        mock_url = bench.start_mock(procs, load)
        if args.shared:
            redis_url = start_redis(procs)
        targets, labels = [], []
        traced = (False, True) if args.traces else (False,)
        for n, (traces, src) in enumerate((t, src) for t in traced for src in args.srcs):
            for shared in (False, True) if args.shared else (False,):
                storage = {"redis_url": redis_url} if shared else None
                extra = {"telemetry": {"otlp_endpoint": f"{mock_url}/v1/traces"}} if traces else None
                name = f"tree {n}{' + redis' if shared else ''}"
                home = tmp / f"t{n}{'r' if shared else ''}"
                target = bench.start_turnout(
                    name, home, mock_url, procs, str(src), args.level, pin, storage=storage, config_extra=extra
                )
                bench.wait_ready(target.url, target.proc, target.key)
                targets.append(target)
                labels.append(f"{src}{' + traces' if traces else ''}{'  with storage.redis_url' if shared else ''}")
        results: list[list[float]] = [[] for _ in targets]
        commands: list[list[float]] = [[] for _ in targets]
        p50s: list[list[float]] = [[] for _ in targets]
        for _ in range(args.rounds):
            for target, got, sent, p50 in zip(targets, results, commands, p50s, strict=True):
                before = redis_commands(redis_url) if redis_url else 0
                cell = bench.run_wrk(wrk, target, args.stream, args.c, args.d, tmp, mock_url)
                if cell["errors"] or cell["reached"] < 0.99:
                    sys.exit(f"{target.name}: {cell['errors']} errors, reached {cell['reached']:.2f}: not comparable")
                got.append(bench._us(cell))
                p50.append(cell["p50"])
                if redis_url and cell["requests"]:
                    sent.append((redis_commands(redis_url) - before) / cell["requests"])
    finally:
        bench.stop_all(procs)
    mode = "stream (64 SSE chunks)" if args.stream else "non-stream"
    print(f"\n{mode}, c={args.c}, {args.rounds} rounds of {args.d:g} s, --log-level {args.level}\n")
    for label, got, sent, p50 in zip(labels, results, commands, p50s, strict=True):
        rounds = ", ".join(f"{x:.0f}" for x in got)
        redis = f"; {statistics.median(sent):.2f} Redis commands/req" if "redis_url" in label and sent else ""
        latency = f", p50 {statistics.median(p50):.2f} ms"
        print(f"{statistics.median(got):7.1f} us CPU/req{latency}  {label}  (rounds: {rounds}){redis}")


def start_redis(procs: list[subprocess.Popen[bytes]]) -> str:
    """A throwaway redis-server on loopback (Debian's ``redis-server``)."""
    port = bench.free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    for _ in range(100):
        try:
            redis_commands(f"redis://127.0.0.1:{port}/0")
            return f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    sys.exit("redis-server did not start (apt-get install redis-server)")


def redis_commands(url: str) -> int:
    """Redis's count of the commands it has processed (each command of a pipeline or script counted)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"INFO stats\r\n")
        data = b""
        while b"total_commands_processed" not in data or not data.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith("total_commands_processed:"):
            return int(line.split(":")[1])
    raise OSError("no total_commands_processed in INFO")


if __name__ == "__main__":
    main()
