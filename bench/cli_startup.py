"""Wall time of short `turnout` commands, next to the interpreter's own start-up.

    python bench/cli_startup.py [--runs 15]

Each command runs ``--runs`` times as a fresh process (``python -m turnout ...``, the same code as the
installed ``turnout`` script) in a scratch directory whose store already exists and is migrated, so
``key list`` measures what an operator's second and later calls cost: once with no gateway (it reads the store)
and once against a running gateway (``turnout serve`` on a free loopback port, started here and stopped at the
end; the command is then the admin API's call). Prints a Markdown table: command, median and best wall
milliseconds, median CPU milliseconds of the command's process (user + system: what the wall time comes down to
on an idle machine, where nothing waits for a core), and the median wall minus ``python -c pass``.
Targets on an idle machine: under 500 ms for ``turnout --help`` and ``key list`` on the store (issue 13 of the
first round); under 300 ms for ``key list`` against a running gateway (issue 32, item 13). On the shared 2-core
development machine figures move by 20% or more between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS: list[tuple[str, list[str]]] = [
    ("python -c pass", ["-c", "pass"]),
    ("turnout --version", ["-m", "turnout", "--version"]),
    ("turnout --help", ["-m", "turnout", "--help"]),
    ("turnout serve --help", ["-m", "turnout", "serve", "--help"]),
    ("turnout key list", ["-m", "turnout", "key", "list"]),
    ("turnout worker list", ["-m", "turnout", "worker", "list"]),
    ("turnout config check", ["-m", "turnout", "config", "check"]),
]
# against the running gateway (its config names the gateway's port)
GATEWAY_COMMANDS: list[tuple[str, list[str]]] = [
    ("turnout key list (gateway running)", ["-m", "turnout", "key", "list", "--config", "turnout-data/gateway.json"]),
]
ADMIN_TOKEN = "bench-admin-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _gateway(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """`turnout serve` on the bench's store (config ``gateway.json``) until the block ends."""
    port = _free_port()
    config = {"storage": {"data_dir": "."}, "listen": {"host": "127.0.0.1", "port": port}, "workers": []}
    (cwd / "turnout-data" / "gateway.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "turnout", "serve", "--no-demo", "--no-access-log", "--config"]
    proc = subprocess.Popen(
        [*argv, "turnout-data/gateway.json"], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"turnout serve exited ({proc.returncode})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("turnout serve did not answer in 60 s") from None
                time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def _measure(label: str, args: list[str], cwd: Path, env: dict[str, str], runs: int) -> tuple[str, float, float, float]:
    _time(args, cwd, env)  # warm the page cache and .pyc files
    timed = [_time(args, cwd, env) for _ in range(runs)]
    walls, cpus = [w for w, _ in timed], [c for _, c in timed]
    return label, statistics.median(walls), min(walls), statistics.median(cpus)


def _time(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system) milliseconds of one run. On a loaded machine the wall time includes waiting
    for a core; the CPU time is close to what an idle machine's wall time would be."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, timeout=60)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed * 1000, cpu * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command (default 15)")
    opts = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("TURNOUT_ADMIN_TOKEN", None)
    with tempfile.TemporaryDirectory(prefix="turnout-bench-") as scratch:
        cwd = Path(scratch)
        data = cwd / "turnout-data"
        data.mkdir()
        # port 1: nothing answers, so `key list` measures the store path (a gateway at 8080 is not asked)
        (data / "config.json").write_text(json.dumps({"storage": {"data_dir": "."}, "listen": {"port": 1}}))
        _time(["-m", "turnout", "key", "create", "--app", "bench"], cwd, env)  # creates and migrates the store
        rows = [_measure(label, args, cwd, env, opts.runs) for label, args in COMMANDS]
        served = {**env, "TURNOUT_ADMIN_TOKEN": ADMIN_TOKEN}
        with _gateway(cwd, served):
            rows += [_measure(label, args, cwd, served, opts.runs) for label, args in GATEWAY_COMMANDS]
    base_wall = rows[0][1]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"fresh process per run, median of {opts.runs}, {os.cpu_count()} CPUs, load average {load}, "
        f"python {sys.version.split()[0]}"
    )
    print()
    print("| command | median wall ms | best wall ms | median CPU ms | wall minus `python -c pass` ms |")
    print("|---|---:|---:|---:|---:|")
    for label, median, best, cpu in rows:
        print(f"| `{label}` | {median:.0f} | {best:.0f} | {cpu:.0f} | {median - base_wall:.0f} |")


if __name__ == "__main__":
    main()
