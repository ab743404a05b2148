"""Wall time of short `turnout` commands, next to the interpreter's own start-up.

    python bench/cli_startup.py [--runs 15]

Each command runs ``--runs`` times as a fresh process (``python -m turnout ...``, the same code as the
installed ``turnout`` script) in a scratch directory whose store already exists and is migrated, so
``key list`` measures what an operator's second and later calls cost. Prints a Markdown table: command,
median and best wall milliseconds, median CPU milliseconds (user + system: what the wall time comes down to
on an idle machine, where nothing waits for a core), and the median wall minus ``python -c pass``.
The target (issue 13) is under 500 ms for ``turnout --help`` and ``turnout key list`` on an idle machine;
on the shared 2-core development machine figures move by 20% or more between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
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
        rows = []
        for label, args in COMMANDS:
            _time(args, cwd, env)  # warm the page cache and .pyc files
            runs = [_time(args, cwd, env) for _ in range(opts.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            rows.append((label, statistics.median(walls), min(walls), statistics.median(cpus)))
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
