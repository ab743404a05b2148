"""Gateway overhead benchmark: direct upstream, a bare aiohttp pass-through, nginx, Portkey, Turnout, LiteLLM.

One run on this machine, every target pointed at the same fast mock upstream (bench/mock_upstream.py),
load from wrk (one thread) on loopback, each cell bounded by --duration seconds. Prints one markdown table.

    python bench/run.py [--duration 3] [--concurrency 1,32,64] [--skip-litellm] [--skip-portkey]
                        [--baseline OLD/src] [--access-log] [--pin CPU]

Each proxy runs pinned to one CPU (``--pin``, default the last one; wrk and the mock run on the others), and
beside req/s, p50 and p99 the table gives the proxy's CPU per request: utime+stime of its process tree from
``/proc`` over the measured seconds, divided by the requests wrk completed, and its inverse, requests per
CPU-second (the figure that is fair on a shared machine). "reached" is the share of those requests the mock
counted (``GET /__count``): a proxy that answered without reaching the upstream shows below 1.00.

Turnout is measured on each client API it translates too, beside ``/v1/chat/completions`` on the same gateway
process: ``turnout /v1/responses`` posts the Responses API's equivalent request (``{"model", "input", "store":
false}``, as Codex sends it), which Turnout translates onto the mock's ``/v1/chat/completions`` and whose answer and
stream (64 SSE chunks, then 64 ``response.output_text.delta`` events among the Responses events) it turns back;
``turnout /v1/responses stored`` leaves ``store`` at the API's default, so each answer is also written to the
store; ``turnout /v1/messages`` posts the Anthropic Messages API's (Claude Code's), translated both ways the same
way. The table ends with each one's CPU per request against the chat route's.

Turnout runs at ``--log-level warning`` (its access log is on, as by default, but lines are written at info,
so none is built); ``--access-log`` adds a second Turnout target at ``--log-level info`` (``turnout serve``'s
default) with its access lines to /dev/null, so the table shows what the log costs.

Installs what it needs (once; later runs reuse it): wrk and nginx (Debian packages, needs root), Portkey's
gateway (npm ``@portkey-ai/gateway`` into bench/.cache-portkey, ``@hono/node-server`` pinned to 1.14.1 with an
npm override: newer ones break its streams with ``TypeError: immutable``) and LiteLLM's proxy into
bench/.venv-litellm.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LITELLM_VENV = BENCH / ".venv-litellm"
PORTKEY_DIR = BENCH / ".cache-portkey"
PORTKEY_VERSION = "1.15.2"
# Portkey's streams fail with "TypeError: immutable" on @hono/node-server newer than this.
HONO_NODE_SERVER = "1.14.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}
CHAT = "/v1/chat/completions"
# The other client APIs Turnout serves, measured beside the chat route on the same gateway: label -> (path, request
# body). Each is translated onto the mock's chat route and its answer turned back. The Responses API stores every
# answer unless told not to (Codex says store: false; the openai SDK leaves the default): both are measured.
TRANSLATED = {
    "/v1/responses": ("/v1/responses", {"model": "mock", "input": "hi", "store": False}),
    "/v1/responses stored": ("/v1/responses", {"model": "mock", "input": "hi"}),
    # the Anthropic Messages API (Claude Code's), its calls and streams translated both ways
    "/v1/messages": (
        "/v1/messages",
        {"model": "mock", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    ),
}
# LiteLLM refuses to start without a master key; every target gets the same header (others ignore it).
MASTER_KEY = "sk-bench-" + "7f3a9c2e5b8d1f4a6c0e9b2d7a5f3c1e"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def ensure_deb(exe: str, package: str) -> str:
    """The Debian package's executable, installed with apt-get when missing (needs root)."""
    found = _which(exe)
    if found:
        return found
    if os.geteuid() != 0:
        sys.exit(f"{exe} is missing: apt-get install {package}")
    print(f"installing {package} (apt-get, once)...", file=sys.stderr)
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    if subprocess.run(install, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(install, check=True, stdout=subprocess.DEVNULL)
    return _which(exe) or sys.exit(f"{package} installed but {exe} is not on the PATH")


def pinned_wrk() -> tuple[list[str], str | None, str | None]:
    """(the wrk command, the CPU a proxy is pinned to, the CPUs wrk and the mock get): the last CPU for the
    proxy, the others for the load, as run.py's default (no pinning on one CPU)."""
    wrk_exe = ensure_deb("wrk", "wrk")
    cpus = sorted(os.sched_getaffinity(0))
    pin = str(cpus[-1]) if len(cpus) > 1 else None
    load = ",".join(str(c) for c in cpus if str(c) != pin) if pin else None
    return ([wrk_exe] if load is None else ["taskset", "-c", load, wrk_exe]), pin, load


def ensure_portkey() -> Path:
    """Portkey's gateway from npm into bench/.cache-portkey (reused while the versions match)."""
    entry = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    pinned = PORTKEY_DIR / "node_modules" / "@hono" / "node-server" / "package.json"

    def version(path: Path) -> str | None:
        try:
            return str(json.loads(path.read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None

    gateway = PORTKEY_DIR / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
    if entry.exists() and version(pinned) == HONO_NODE_SERVER and version(gateway) == PORTKEY_VERSION:
        return entry
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        sys.exit("Portkey's gateway needs node and npm (apt-get install nodejs npm), or pass --skip-portkey")
    print(f"installing @portkey-ai/gateway {PORTKEY_VERSION} into bench/.cache-portkey (once)...", file=sys.stderr)
    PORTKEY_DIR.mkdir(exist_ok=True)
    manifest = {
        "name": "turnout-bench-portkey",
        "private": True,
        "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
        "overrides": {"@hono/node-server": HONO_NODE_SERVER},
    }
    (PORTKEY_DIR / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PORTKEY_DIR, check=True, timeout=600
    )
    if version(pinned) != HONO_NODE_SERVER:
        sys.exit(f"npm did not pin @hono/node-server to {HONO_NODE_SERVER} (got {version(pinned)})")
    return entry


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
    headers: dict[str, str] = field(default_factory=dict)  # more request headers (Portkey's provider and host)
    path: str = CHAT  # the route wrk posts to
    body: dict[str, Any] = field(default_factory=lambda: dict(BODY))


def wait_ready(
    url: str,
    proc: subprocess.Popen[bytes] | None,
    key: str = MASTER_KEY,
    timeout: float = 120,
    headers: dict[str, str] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"{url}: process exited with {proc.returncode}:\n{_tail(proc)}")
        try:
            req = urllib.request.Request(
                url + "/v1/chat/completions",
                data=json.dumps(BODY).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}", **(headers or {})},
            )
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    sys.exit(f"{url} did not answer in {timeout:.0f}s")


def start(
    cmd: list[str], env: dict[str, str] | None = None, cpus: str | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a target in its own session; ``cpus``: pin it (and every thread and child) with taskset."""
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the target runs): its output, shown if it exits early
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd)
    _logs[proc.pid] = log
    return proc


_logs: dict[int, Any] = {}


def start_mock(procs: list[subprocess.Popen[bytes]], cpus: str | None = None) -> str:
    """The mock upstream (bench/mock_upstream.py) on a free port, added to ``procs``, answering; its URL."""
    port = free_port()
    mock = start([sys.executable, str(BENCH / "mock_upstream.py"), str(port)], cpus=cpus)
    procs.append(mock)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, mock)
    return url


def stop_all(procs: list[subprocess.Popen[bytes]], wait_s: float = 10) -> None:
    """SIGTERM every target's process group, then wait for each, SIGKILLing one that outlasts ``wait_s``."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
    for proc in procs:
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _tail(proc: subprocess.Popen[bytes]) -> str:
    log = _logs.get(proc.pid)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]


def _tree(root: int) -> list[int]:
    """The process and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_seconds(proc: subprocess.Popen[bytes] | None) -> float:
    """utime+stime of the process tree (every thread of each process), in seconds."""
    if proc is None:
        return 0.0
    total = 0
    for pid in _tree(proc.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat
    return total / CLK_TCK


def mock_count(mock_url: str) -> int:
    with urllib.request.urlopen(mock_url + "/__count", timeout=5) as resp:
        return int(resp.read())


def rss_mib(proc: subprocess.Popen[bytes] | None) -> float | None:
    """Resident memory of the process tree."""
    if proc is None:
        return None
    total = 0
    for pid in _tree(proc.pid):
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
    done = re.search(r"^\s*(\d+) requests in", text, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = (int(non2xx[1]) if non2xx else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    return {
        "rps": float(rps[1]) if rps else 0.0,
        "p50": latency("50"),
        "p99": latency("99"),
        "errors": errors,
        "requests": int(done[1]) if done else 0,
    }


def run_wrk(
    wrk: list[str],
    target: Target,
    stream: bool,
    conns: int,
    duration: float,
    script_dir: Path,
    mock_url: str,
) -> dict[str, float]:
    """One measured cell: wrk's figures, the proxy's CPU seconds over it, and the requests the mock counted."""
    script = script_dir / f"post-{'stream' if stream else 'plain'}-{abs(hash(target.name))}.lua"
    body = json.dumps({**target.body, "stream": stream})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {target.key}", **target.headers}
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{body}'\n"
        + "".join(f"wrk.headers['{k}'] = '{v}'\n" for k, v in headers.items())
    )
    url = target.url
    cmd = [
        *wrk,
        "-t1",
        f"-c{conns}",
        f"-d{duration:g}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(script),
        url + target.path,
    ]
    n = len(wrk)
    warm = [*cmd[: n + 2], "-d1s", *cmd[n + 3 :]]
    subprocess.run(warm, capture_output=True, check=True, timeout=40)  # warm-up
    counted, cpu = mock_count(mock_url), cpu_seconds(target.proc)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 30)
    got = parse_wrk(out.stdout)
    got["cpu"] = cpu_seconds(target.proc) - cpu
    got["reached"] = (mock_count(mock_url) - counted) / got["requests"] if got["requests"] else 0.0
    return got


def start_turnout(
    name: str,
    home: Path,
    mock_url: str,
    procs: list[subprocess.Popen[bytes]],
    src: str | None,
    log_level: str = "warning",
    cpus: str | None = None,
    *,
    processes: int = 1,
    rpm: int | None = None,
    storage: dict[str, Any] | None = None,
    config_extra: dict[str, Any] | None = None,
) -> Target:
    """A Turnout gateway with its own store and a scoped app key; ``src``: run that source tree instead
    (a checkout's ``src``, e.g. a git worktree of the previous commit) for a side-by-side baseline;
    ``log_level`` ``info``: with its access log (one line per request); ``processes``: `serve --workers N`;
    ``rpm``: the key's requests-per-minute limit; ``storage``: more of the storage section (``redis_url``);
    ``config_extra``: config sections added (``telemetry``...)."""
    home.mkdir(parents=True)
    config = {
        "storage": {"data_dir": str(home / "data"), **(storage or {})},
        "routing": {"max_concurrent": 4096},
        "workers": [{"name": "mock", "url": mock_url, "type": "openai"}],
        **(config_extra or {}),
    }
    (home / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "TURNOUT_ADMIN_TOKEN": "bench"}
    # this checkout's sources unless told otherwise (not whatever turnout the interpreter has installed)
    env["PYTHONPATH"] = str(Path(src).resolve() if src is not None else ROOT / "src")
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
            *([] if rpm is None else ["--rpm", str(rpm)]),
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
        *([] if processes == 1 else ["--workers", str(processes)]),
    ]
    procs.append(start(cmd, env=env, cpus=cpus))
    return Target(name, f"http://127.0.0.1:{port}", procs[-1], key)


NGINX_CONF = """worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log error;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream mock {{
        server {upstream};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def start_nginx(nginx: str, tmp: Path, mock_url: str, procs: list[subprocess.Popen[bytes]], cpus: str | None) -> Target:
    """Debian's nginx as a plain reverse proxy: one worker, keep-alive to the upstream, no buffering."""
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=mock_url.removeprefix("http://"), port=port))
    procs.append(start([nginx, "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "nginx-error.log")], cpus=cpus))
    return Target("nginx", f"http://127.0.0.1:{port}", procs[-1])


def start_portkey(entry: Path, mock_url: str, procs: list[subprocess.Popen[bytes]], cpus: str | None) -> Target:
    """Portkey's gateway (Node.js), the mock as an ``openai`` provider at a custom host (headers per request)."""
    port = free_port()
    env = {**os.environ, "NODE_ENV": "production"}
    procs.append(start(["node", str(entry), f"--port={port}", "--headless"], env=env, cpus=cpus, cwd=entry.parent))
    headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": mock_url + "/v1"}
    return Target("portkey gateway", f"http://127.0.0.1:{port}", procs[-1], headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell and round (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, targets interleaved; medians reported")
    parser.add_argument("--concurrency", default="1,32,64")
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument("--skip-portkey", action="store_true")
    parser.add_argument("--skip-nginx", action="store_true")
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        help="also run Turnout from this source tree (e.g. the src/ of a worktree of the previous commit)",
    )
    parser.add_argument(
        "--access-log", action="store_true", help="also run Turnout with its access log on (--log-level info)"
    )
    cpus = sorted(os.sched_getaffinity(0))
    parser.add_argument(
        "--pin",
        type=int,
        default=cpus[-1] if len(cpus) > 1 else None,
        help="CPU every proxy is pinned to; wrk and the mock get the others (default: the last CPU; -1: no pinning)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    pin = None if args.pin is None or args.pin < 0 else str(args.pin)
    rest = ",".join(str(c) for c in cpus if str(c) != pin) or None
    load = None if pin is None else rest
    wrk_exe = ensure_deb("wrk", "wrk")
    wrk = [wrk_exe] if load is None else ["taskset", "-c", load, wrk_exe]
    nginx = None if args.skip_nginx else ensure_deb("nginx", "nginx")
    portkey = None if args.skip_portkey else ensure_portkey()
    litellm = None if args.skip_litellm else ensure_litellm()

    tmp = Path(tempfile.mkdtemp(prefix="turnout-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_url = start_mock(procs, load)
        targets = [Target("direct (mock)", mock_url, procs[-1])]

        port = free_port()
        procs.append(start([sys.executable, str(BENCH / "passthrough.py"), str(port), mock_url], cpus=pin))
        targets.append(Target("bare aiohttp pass-through", f"http://127.0.0.1:{port}", procs[-1]))
        if nginx is not None:
            targets.append(start_nginx(nginx, tmp, mock_url, procs, pin))
        if portkey is not None:
            targets.append(start_portkey(portkey, mock_url, procs, pin))

        turnout = start_turnout("turnout", tmp / "current", mock_url, procs, None, cpus=pin)
        targets.append(turnout)
        for label, (path, body) in TRANSLATED.items():  # the same gateway process, another client API
            targets.append(Target(f"turnout {label}", turnout.url, turnout.proc, turnout.key, path=path, body=body))
        if args.baseline:
            targets.append(
                start_turnout("turnout (baseline)", tmp / "baseline", mock_url, procs, args.baseline, cpus=pin)
            )
        if args.access_log:
            targets.append(start_turnout("turnout + access log", tmp / "access", mock_url, procs, None, "info", pin))

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
            litellm_cmd = [str(litellm), "--config", str(tmp / "litellm.yaml"), "--host", "127.0.0.1"]
            procs.append(start([*litellm_cmd, "--port", str(port), "--num_workers", "1"], env=lenv, cpus=pin))
            targets.append(Target("litellm proxy", f"http://127.0.0.1:{port}", procs[-1]))

        for t in targets:
            wait_ready(t.url, t.proc, t.key, headers=t.headers)

        # Targets run back to back inside each cell and cells repeat over rounds: on a shared machine the
        # load from elsewhere then hits every target alike, and the median drops the outliers.
        samples: dict[tuple[str, bool, int], list[dict[str, float]]] = {}
        for round_no in range(1, args.rounds + 1):
            for stream in (False, True):
                for conns in levels:
                    for t in targets:
                        got = run_wrk(wrk, t, stream, conns, args.duration, tmp, mock_url)
                        samples.setdefault((t.name, stream, conns), []).append(got)
                        print(
                            f"  round {round_no} {t.name:28} stream={stream!s:5} c={conns:<3} {got['rps']:9.0f} req/s"
                            f" {_us(got):7.0f} us CPU/req reached {got['reached']:.2f}",
                            file=sys.stderr,
                        )
        results: dict[tuple[str, bool, int], dict[str, float]] = {}
        for cell, runs in samples.items():
            results[cell] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
            results[cell]["us"] = statistics.median(_us(r) for r in runs)
            results[cell]["reached"] = min(r["reached"] for r in runs)
            results[cell]["errors"] = sum(r["errors"] for r in runs)
        memory = {t.name: rss_mib(t.proc) for t in targets}
        print_table(targets, results, levels, memory, args.duration, args.rounds, pin)
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


def _us(run: dict[str, float]) -> float:
    """Proxy CPU microseconds per completed request (inf when none completed)."""
    return run["cpu"] * 1e6 / run["requests"] if run["requests"] else float("inf")


def print_table(
    targets: list[Target],
    results: dict[tuple[str, bool, int], dict[str, float]],
    levels: list[int],
    memory: dict[str, float | None],
    duration: float,
    rounds: int,
    pin: str | None,
) -> None:
    base = "bare aiohttp pass-through"
    where = f"proxies pinned to CPU {pin}" if pin is not None else "no pinning"
    print(
        f"\nwrk -t1, {duration:g}s per cell, median of {rounds} interleaved rounds, mock upstream, "
        f"{os.cpu_count()} CPUs, {where}, {time.strftime('%Y-%m-%d')}\n"
    )
    print(
        "| mode | c | target | req/s | p50 ms | p99 ms | p99/p50 | errors | reached | CPU us/req | req/CPU-s "
        "| per CPU-s vs nginx | req/s vs pass-through |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for stream in (False, True):
        for conns in levels:
            floor = results[(base, stream, conns)]["rps"]
            ref = results.get(("nginx", stream, conns), {}).get("us")
            for t in targets:
                r = results[(t.name, stream, conns)]
                per_cpu = 1e6 / r["us"] if r["us"] else float("inf")
                vs_nginx = f"{ref / r['us']:.2f}x" if ref and r["us"] and t.proc is not None else "-"
                vs_base = f"{r['rps'] / floor:.2f}x" if floor else "-"
                tail = f"{r['p99'] / r['p50']:.1f}" if r["p50"] else "-"
                mode = "stream (64 SSE chunks)" if stream else "non-stream"
                print(
                    f"| {mode} | {conns} | {t.name} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {tail} | "
                    f"{r['errors']:.0f} | {r['reached']:.2f} | {r['us']:.0f} | {per_cpu:.0f} | {vs_nginx} | {vs_base} |"
                )
    print("\n(direct (mock): the CPU is the mock's own, on the load CPU with wrk.)")
    print(f"\n| Turnout, CPU per request against {CHAT} | mode | c | CPU us/req | vs chat |\n|---|---|---|---:|---:|")
    for label in TRANSLATED:
        for stream in (False, True):
            for conns in levels:
                chat, other = (
                    results[("turnout", stream, conns)]["us"],
                    results[(f"turnout {label}", stream, conns)]["us"],
                )
                mode = "stream" if stream else "non-stream"
                print(f"| {label} | {mode} | {conns} | {other:.0f} | {other / chat:.2f}x |")
    direct = results[("direct (mock)", False, levels[0])]["p50"]
    turnout = results[("turnout", False, levels[0])]["p50"]
    print(f"\nadded p50 at c={levels[0]} (turnout - direct, non-stream): {turnout - direct:.3f} ms")
    print("\n| target | RSS after load (MiB) |\n|---|---:|")
    for name, mib in memory.items():
        if mib is not None and name != "direct (mock)":
            print(f"| {name} | {mib:.0f} |")


if __name__ == "__main__":
    main()
