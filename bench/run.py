"""Gateway overhead benchmark: direct upstream vs a bare aiohttp pass-through vs Turnout vs LiteLLM.

One run on this machine, every target pointed at the same fast mock upstream (bench/mock_upstream.py),
load from wrk (one thread) on loopback, each cell bounded by --duration seconds. Prints one markdown table.

    python bench/run.py [--duration 5] [--concurrency 1,16,64] [--skip-litellm] [--baseline OLD/src] [--access-log]

Turnout runs at ``--log-level warning`` (no access lines); ``--access-log`` adds a second Turnout target at
``--log-level info`` with its access log on (lines to /dev/null), so the table shows what the log costs.

Installs what it needs: wrk (Debian package, needs root) and LiteLLM's proxy into bench/.venv-litellm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LITELLM_VENV = BENCH / ".venv-litellm"
BODY = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}
# LiteLLM refuses to start without a master key; every target gets the same header (others ignore it).
MASTER_KEY = "sk-bench-" + "7f3a9c2e5b8d1f4a6c0e9b2d7a5f3c1e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        sys.exit("wrk is missing: apt-get install wrk")
    subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=True, stdout=subprocess.DEVNULL)
    return shutil.which("wrk") or sys.exit("wrk did not install")


def ensure_litellm() -> Path:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        print("installing LiteLLM proxy into bench/.venv-litellm (once)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=True)
    return exe


@dataclass
class Target:
    name: str
    url: str
    proc: subprocess.Popen[bytes] | None
    key: str = MASTER_KEY  # sent as the bearer token (Turnout gets a real app key with a scope)


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, key: str = MASTER_KEY, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"{url}: process exited with {proc.returncode}")
        try:
            req = urllib.request.Request(
                url + "/v1/chat/completions",
                data=json.dumps(BODY).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
            )
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"{url} did not answer in {timeout:.0f}s")


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


def rss_mib(proc: subprocess.Popen[bytes] | None) -> float | None:
    """Resident memory of the process and its children."""
    if proc is None:
        return None
    total = 0
    pids = [proc.pid]
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
        pids += [int(p) for p in out.stdout.split()]
    except OSError:
        pass
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_wrk(text: str) -> dict[str, float]:
    def latency(pct: str) -> float:
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        return float(m[1]) * _UNITS[m[2]] if m else float("nan")

    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = (int(non2xx[1]) if non2xx else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    return {"rps": float(rps[1]) if rps else 0.0, "p50": latency("50"), "p99": latency("99"), "errors": errors}


def run_wrk(
    wrk: str, url: str, stream: bool, conns: int, duration: float, script_dir: Path, key: str
) -> dict[str, float]:
    script = script_dir / f"post-{'stream' if stream else 'plain'}-{abs(hash(key))}.lua"
    body = json.dumps({**BODY, "stream": stream})
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{body}'\nwrk.headers['Content-Type'] = 'application/json'\n"
        f"wrk.headers['Authorization'] = 'Bearer {key}'\n"
    )
    cmd = [
        wrk,
        "-t1",
        f"-c{conns}",
        f"-d{duration:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(script),
        url + "/v1/chat/completions",
    ]
    subprocess.run([*cmd[:3], "-d1s", *cmd[4:]], capture_output=True, check=True)  # warm-up
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 30)
    return parse_wrk(out.stdout)


def start_turnout(
    name: str,
    home: Path,
    mock_url: str,
    procs: list[subprocess.Popen[bytes]],
    src: str | None,
    log_level: str = "warning",
) -> Target:
    """A Turnout gateway with its own store and a scoped app key; ``src``: run that source tree instead
    (a checkout's ``src``, e.g. a git worktree of the previous commit) for a side-by-side baseline;
    ``log_level`` ``info``: with its access log (one line per request)."""
    home.mkdir(parents=True)
    config = {
        "storage": {"data_dir": str(home / "data")},
        "routing": {"max_concurrent": 4096},
        "workers": [{"name": "mock", "url": mock_url, "type": "openai"}],
    }
    (home / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "TURNOUT_ADMIN_TOKEN": "bench"}
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    # the key first: the store is created and migrated once, before the gateway opens it
    key = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnout",
            "key",
            "create",
            "--app",
            "bench",
            "--models",
            "model:mock",
            "--config",
            str(home / "config.json"),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "turnout",
        "serve",
        "--config",
        str(home / "config.json"),
        "--port",
        str(port),
        "--log-level",
        log_level,
    ]
    procs.append(start(cmd, env=env))
    return Target(name, f"http://127.0.0.1:{port}", procs[-1], key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, targets interleaved; medians reported")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        help="also run Turnout from this source tree (e.g. the src/ of a worktree of the previous commit)",
    )
    parser.add_argument(
        "--access-log", action="store_true", help="also run Turnout with its access log on (--log-level info)"
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    wrk = ensure_wrk()
    litellm = None if args.skip_litellm else ensure_litellm()

    tmp = Path(tempfile.mkdtemp(prefix="turnout-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_port = free_port()
        mock = start([sys.executable, str(BENCH / "mock_upstream.py"), str(mock_port)])
        procs.append(mock)
        mock_url = f"http://127.0.0.1:{mock_port}"
        wait_ready(mock_url, mock)
        targets = [Target("direct (mock)", mock_url, None)]

        port = free_port()
        procs.append(start([sys.executable, str(BENCH / "passthrough.py"), str(port), mock_url]))
        targets.append(Target("bare aiohttp pass-through", f"http://127.0.0.1:{port}", procs[-1]))

        targets.append(start_turnout("turnout", tmp / "current", mock_url, procs, None))
        if args.baseline:
            targets.append(start_turnout("turnout (baseline)", tmp / "baseline", mock_url, procs, args.baseline))
        if args.access_log:
            targets.append(start_turnout("turnout + access log", tmp / "access", mock_url, procs, None, "info"))

        if litellm is not None:
            (tmp / "litellm.yaml").write_text(
                "model_list:\n  - model_name: mock\n    litellm_params:\n      model: openai/mock\n"
                f"      api_base: {mock_url}/v1\n      api_key: none\n"
                "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
            )
            port = free_port()
            lenv = {
                **os.environ,
                "LITELLM_LOG": "ERROR",
                "LITELLM_TELEMETRY": "False",
                "DISABLE_SCHEMA_UPDATE": "true",
                "LITELLM_MASTER_KEY": MASTER_KEY,
            }
            procs.append(
                start(
                    [
                        str(litellm),
                        "--config",
                        str(tmp / "litellm.yaml"),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--num_workers",
                        "1",
                    ],
                    env=lenv,
                )
            )
            targets.append(Target("litellm proxy", f"http://127.0.0.1:{port}", procs[-1]))

        for t in targets:
            wait_ready(t.url, t.proc, t.key)

        results: dict[tuple[str, bool, int], dict[str, float]] = {}
        # Targets run back to back inside each cell and cells repeat over rounds: on a shared machine the
        # load from elsewhere then hits every target alike, and the median drops the outliers.
        samples: dict[tuple[str, bool, int], list[dict[str, float]]] = {}
        for round_no in range(1, args.rounds + 1):
            for stream in (False, True):
                for conns in levels:
                    for t in targets:
                        got = run_wrk(wrk, t.url, stream, conns, args.duration, tmp, t.key)
                        samples.setdefault((t.name, stream, conns), []).append(got)
                        print(
                            f"  round {round_no} {t.name:28} stream={stream!s:5} c={conns:<3} {got['rps']:9.0f} req/s",
                            file=sys.stderr,
                        )
        for cell, runs in samples.items():
            results[cell] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
            results[cell]["errors"] = sum(r["errors"] for r in runs)
        memory = {t.name: rss_mib(t.proc) for t in targets}
        print_table(targets, results, levels, memory, args.duration, args.rounds)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
        shutil.rmtree(tmp, ignore_errors=True)


def print_table(
    targets: list[Target],
    results: dict[tuple[str, bool, int], dict[str, float]],
    levels: list[int],
    memory: dict[str, float | None],
    duration: float,
    rounds: int,
) -> None:
    base = "bare aiohttp pass-through"
    print(
        f"\nwrk -t1, {duration:g}s per cell, median of {rounds} interleaved rounds, mock upstream, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}\n"
    )
    print("| mode | c | target | req/s | p50 ms | p99 ms | errors | vs pass-through | vs litellm |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for stream in (False, True):
        for conns in levels:
            floor = results[(base, stream, conns)]["rps"]
            lite = results.get(("litellm proxy", stream, conns), {}).get("rps")
            for t in targets:
                r = results[(t.name, stream, conns)]
                vs_base = f"{r['rps'] / floor:.2f}x" if floor else "-"
                vs_lite = f"{r['rps'] / lite:.1f}x" if lite else "-"
                mode = "stream (64 SSE chunks)" if stream else "non-stream"
                print(
                    f"| {mode} | {conns} | {t.name} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                    f"{r['errors']:.0f} | {vs_base} | {vs_lite} |"
                )
    direct = results[("direct (mock)", False, levels[0])]["p50"]
    turnout = results[("turnout", False, levels[0])]["p50"]
    print(f"\nadded p50 at c={levels[0]} (turnout - direct, non-stream): {turnout - direct:.3f} ms")
    print("\n| target | RSS after load (MiB) |\n|---|---:|")
    for name, mib in memory.items():
        if mib is not None:
            print(f"| {name} | {mib:.0f} |")


if __name__ == "__main__":
    main()
