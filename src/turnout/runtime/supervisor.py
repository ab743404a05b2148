"""Engine supervision: spawn one process group per model, watch it, restart it, persist the registry.

The registry (``engines.json``, 0600, written atomically) records intent before each spawn, so a restarted agent can
re-adopt engines whose PID is alive with the same ``/proc/<pid>/stat`` start time, keeping their port and IPC name:
active when the health endpoint answers, else booting until it does (an engine still loading its model is waited
for, not restarted) or until its boot timeout has passed (then it is killed and restarted like a crashed engine,
saying so in ``last_error``; every boot has that deadline); an engine whose process is gone is started again. A
sleeping engine is re-adopted sleeping (vLLM says so at ``GET /is_sleeping``: its ``/health`` stays 200 while it
sleeps) and a failed one stays failed. A sleeping engine whose process is gone (it sleeps by stopping, or it exited
while asleep in place) stays asleep with no process and is started on wake: starting it at once would take back the
memory its sleep gave up. Records that do not parse are logged and skipped, never fatal.

An engine started again (woken after a sleep by stopping, restarted after a crash, started at re-adoption because
its process was gone) keeps its port while the port is free, and moves to a free one of the agent's range when
something else took it meanwhile (a restart on a taken port would only fail again, with backoff): its record and
report say the new port, and the controller routes there. A port the activation named (``port``) never moves. A
live engine re-adopted after an agent restart keeps its port and IPC name, as the design says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from turnout.atomic import write_atomic
from turnout.core.runtime import (
    MAX_RESTARTS,
    ActivateRequest,
    EnginePhase,
    NoCapacity,
    backoff_s,
    gpu_neighbours,
    gpu_sharing_refusal,
    ipc_name,
    pick_port,
)
from turnout.runtime import kvcached
from turnout.runtime.artifacts import ArtifactError, Progress, fetch_s3
from turnout.runtime.cache import write_served_marker
from turnout.runtime.launch import Launch, connect_host, launch_command
from turnout.runtime.ports import listens_on, port_free
from turnout.upstream.client import UpstreamClient

__all__ = ["EngineRecord", "Supervisor", "host_port", "parse_registry", "process_start_time"]

log = logging.getLogger("turnout.agent")


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), or None when the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass
class EngineRecord:
    model_name: str
    engine: str
    artifact_url: str
    port: int
    ipc_name: str
    args: dict[str, str]
    claim_ref: dict[str, str]
    phase: str = EnginePhase.BOOTING.value
    pid: int | None = None
    pid_start: int | None = None
    restarts: int = 0
    last_error: str | None = None
    last_transition: float = field(default_factory=time.time)
    ready: bool = False
    sleep_level: int | None = None  # the level an in-place sleep used (vLLM level 2 needs its weights reloaded)
    # Where the engine listens: the agent's bind address when it was started (an agent restarted with another
    # --host still reaches, and reports, the engines it adopts where they are).
    host: str = ""
    # Where the agent staged an s3:// artifact (turnout.runtime.artifacts); the engine is started on it.
    local_path: str | None = None
    port_pinned: bool = False  # the activation named the port: a start on it never moves elsewhere

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = {f.name: f for f in fields(EngineRecord)}
_PHASES = {p.value for p in EnginePhase}
_RECORD = TypeAdapter(EngineRecord)


def parse_registry(text: str) -> tuple[list[EngineRecord], list[str]]:
    """The records of an ``engines.json`` document and a problem per thing left out or ignored.

    Tolerant by design (the file may come from an older or newer agent, or be damaged): unknown fields are
    ignored, a record that does not parse is skipped, and only a document that is not JSON at all yields
    nothing."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return [], [f"not JSON ({exc})"]
    raw_records = document.get("engines") if isinstance(document, dict) else None
    if not isinstance(raw_records, list):
        return [], ['no "engines" list']
    records: list[EngineRecord] = []
    problems: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_records):
        if not isinstance(raw, dict):
            problems.append(f"engines[{i}] is not an object; skipped")
            continue
        unknown = sorted(set(raw) - set(_FIELDS))
        if unknown:
            problems.append(f"engines[{i}] has unknown field(s) {unknown}; ignored")
        try:
            record = _RECORD.validate_python({k: v for k, v in raw.items() if k in _FIELDS})
        except ValidationError as exc:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            problems.append(f"engines[{i}] does not parse ({reasons}); skipped")
            continue
        if record.phase not in _PHASES or record.model_name in seen:
            why = "a duplicate model_name" if record.model_name in seen else f"an unknown phase {record.phase!r}"
            problems.append(f"engines[{i}] ({record.model_name}) has {why}; skipped")
            continue
        seen.add(record.model_name)
        records.append(record)
    return records, problems


class Supervisor:
    def __init__(
        self,
        registry_path: Path,
        log_dir: Path,
        *,
        port_range: tuple[int, int],
        backoff_base_s: float = 2.0,
        poll_s: float = 0.2,
        state_poll_s: float = 5.0,
        engine_python: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        boot_timeout_s: float | None = None,
        gpus: int = 0,
        cache_dir: Path | None = None,
    ) -> None:
        self.engine_python = dict(engine_python or {})  # engine -> interpreter that has it installed
        self.gpus = gpus  # the pod's GPUs (NVML): its vLLM and SGLang engines share them through kvcached
        # The node's weight cache (AIBrix's): s3:// artifacts are downloaded there (else beside the registry) and
        # marked served once they are complete.
        self.cache_dir = cache_dir
        self.artifact_root = cache_dir if cache_dir is not None else registry_path.parent / "artifacts"
        self.downloads: dict[str, Progress] = {}  # model -> its artifact's download under way
        # How long a boot may take before the engine is killed and restarted; None: each engine's own timeout.
        self.boot_timeout_s = boot_timeout_s
        self._boot_since: dict[str, float] = {}  # model -> monotonic time its current boot began
        self._adopted: set[str] = set()  # engines adopted from an earlier agent and not started again since
        self.host = host  # where engines it starts listen: the agent's own bind address
        self.registry_path = registry_path
        self.log_dir = log_dir
        self.port_range = port_range
        self.backoff_base_s = backoff_base_s
        self.poll_s = poll_s  # liveness, and readiness while booting
        self.state_poll_s = state_poll_s  # the sleep state of a settled (ready or sleeping) engine
        self._state_checked: dict[str, float] = {}  # model -> monotonic time of its last sleep-state check
        self._foreign_port: dict[str, int] = {}  # model -> the engine pid whose port another process holds
        self.engines: dict[str, EngineRecord] = {}
        self._exit_codes: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # one lifecycle operation per engine at a time
        self.client = UpstreamClient(connect_timeout_s=1, total_timeout_s=2)
        self.restarts_total = 0

    # -- registry ----------------------------------------------------------------------------------
    def save(self) -> None:
        document = {"version": 1, "engines": [e.to_json() for e in self.engines.values()]}
        write_atomic(self.registry_path, (json.dumps(document, indent=2) + "\n").encode(), mode=0o600)

    async def recover(self) -> None:
        """Re-adopt live engines from the registry; restart or clean up the rest. Failed engines stay failed."""
        try:
            text = self.registry_path.read_text()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.error("cannot read %s (%s); starting with no engines", self.registry_path, exc)
            return
        records, problems = parse_registry(text)
        for problem in problems:
            log.error("%s: %s", self.registry_path, problem)
        if problems:  # the rewrite below drops what did not parse: keep the original for a person to read
            kept = self.registry_path.with_name(self.registry_path.name + ".rejected")
            write_atomic(kept, text.encode(), mode=0o600)
            log.error("%s: the original is kept as %s", self.registry_path, kept)
        for record in records:
            self.engines[record.model_name] = record
            record.host = record.host or self.host  # an older agent's record: it started engines where it listened
            if record.phase == EnginePhase.FAILED.value:
                log.warning(
                    "%s stays failed (%s); deactivate and activate it to start it again",
                    record.model_name,
                    record.last_error,
                )
                continue
            if record.pid is not None and process_start_time(record.pid) == record.pid_start:
                await self._adopt(record)
                self._watch(record.model_name)
                continue
            record.pid = record.pid_start = None
            record.sleep_level = None
            if record.phase == EnginePhase.SLEEPING.value:
                # no process (llama.cpp sleeps by stopping; an engine asleep in place may have exited meanwhile):
                # it stays asleep, keeps its port and IPC name, and starts on wake, not now with its memory
                continue
            self._set(record, EnginePhase.BOOTING)
            await self._spawn(record)
        self.save()

    async def _adopt(self, record: EngineRecord) -> None:
        """Take over a live engine of an earlier agent in the state it is in: sleeping, active when it answers,
        else booting (the monitor waits for it to answer, as for a fresh start). A live engine is never killed
        here: one still loading its model does not answer yet, and restarting it would only start that over.
        AIBrix's runtime does the same (vllm-project/aibrix ``python/aibrix/aibrix/runtime/model_runtime.py``,
        ``re_adopt``: a live process is ``active`` when ready, else ``booting``). The wait has the engine's boot
        timeout as its deadline, counted from when the registry saw it start booting (an engine the earlier agent
        had ready gets the whole timeout from now): the monitor kills and restarts one that never answers."""
        booting_since = record.last_transition if record.phase == EnginePhase.BOOTING.value else time.time()
        asleep = await self._sleep_state(record)
        if asleep is None and record.phase == EnginePhase.SLEEPING.value and self.launch(record).sleep_api:
            asleep = True  # an engine that cannot say (SGLang) is as the registry last saw it; never probed awake
        if asleep:
            record.ready = False
            record.sleep_level = record.sleep_level or 1
            self._set(record, EnginePhase.SLEEPING)
            log.info("re-adopted %s sleeping (pid %s, port %s)", record.model_name, record.pid, record.port)
            return
        record.ready, record.sleep_level = await self._healthy(record), None
        self._set(record, EnginePhase.ACTIVE if record.ready else EnginePhase.BOOTING)
        if not record.ready:
            self._adopted.add(record.model_name)
            limit, _ = self.boot_limit(record)
            self._boot_since[record.model_name] = time.monotonic() - min(max(time.time() - booting_since, 0), limit)
        log.info("re-adopted %s %s (pid %s, port %s)", record.model_name, record.phase, record.pid, record.port)

    # -- operations --------------------------------------------------------------------------------
    async def activate(self, req: ActivateRequest) -> EngineRecord:
        existing = self.engines.get(req.model_name)
        if existing is not None:
            return existing  # idempotent by model name
        low, high = self.port_range
        taken = {e.port for e in self.engines.values()}
        port = pick_port(req.port, low, high, taken)
        while not req.port and not port_free(self.host, port):  # something else listens there: skip it
            taken.add(port)
            port = pick_port(0, low, high, taken)
        ipc = ipc_name(req.ipc_name, req.model_name, [e.ipc_name for e in self.engines.values()])
        record = EngineRecord(
            req.model_name,
            req.engine,
            req.artifact_url,
            port,
            ipc,
            dict(req.args),
            dict(req.claim_ref),
            host=self.host,
            port_pinned=bool(req.port),
        )
        self.engines[req.model_name] = record
        refusal = await self._sharing_refusal(record)
        if refusal is not None:  # failed before it starts, instead of failing at every restart
            record.last_error = refusal
            self._set(record, EnginePhase.FAILED)
            self.save()
            log.error("%s %s", record.model_name, refusal)
            return record
        self.save()  # intent first: a crash right after spawning still knows this engine
        await self._spawn(record)
        return record

    async def _sharing_refusal(self, record: EngineRecord) -> str | None:
        """Why ``record`` may not start beside this pod's other engines on its GPUs
        (:func:`turnout.core.runtime.gpu_sharing_refusal`). The interpreters concerned (its own and its
        neighbours') are asked whether they have kvcached only when it would share a GPU with another engine."""
        others = [(e.model_name, e.engine, e.phase) for e in self.engines.values() if e is not record]
        neighbours = gpu_neighbours(record.engine, others, self.gpus)
        if not neighbours:
            return None
        pythons = sorted(
            {self.engine_python.get(kind, sys.executable) for kind in {record.engine, *dict(neighbours).values()}}
        )
        answers = await asyncio.gather(*(asyncio.to_thread(kvcached.importable, p) for p in pythons))
        missing = [p for p, ok in zip(pythons, answers, strict=True) if not ok]
        return gpu_sharing_refusal(record.model_name, neighbours, self.gpus, missing)

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def deactivate(self, name: str) -> None:
        record = self.engines[name]
        async with self.lock(name):
            await self._deactivate(record)
        self._locks.pop(name, None)

    async def _deactivate(self, record: EngineRecord) -> None:
        name = record.model_name
        self._set(record, EnginePhase.STOPPING)
        self._stop_download(name)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        await self._stop_process(record)
        self.engines.pop(name, None)
        self._state_checked.pop(name, None)
        self._boot_since.pop(name, None)
        self._adopted.discard(name)
        self.save()

    async def sleep(self, name: str, level: int) -> EngineRecord:
        async with self.lock(name):
            return await self._sleep(self.engines[name], level)

    async def _sleep(self, record: EngineRecord, level: int) -> EngineRecord:
        name = record.model_name
        if record.phase == EnginePhase.SLEEPING.value:
            return record
        if not self.launch(record).sleep_api:
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            await self._stop_process(record)  # memory freed; port, IPC name and registry entry stay reserved
        elif record.engine == "vllm":
            # vllm/entrypoints/serve/dev/sleep/api_router.py: level and mode are query parameters; mode=wait lets
            # a request already under way finish (the engine was de-routed first) instead of aborting it.
            await self._post(record, f"/sleep?level={level}&mode=wait")
        else:
            await self._post(record, "/release_memory_occupation")
        record.ready = False
        record.sleep_level = level if self.launch(record).sleep_api else None
        self._set(record, EnginePhase.SLEEPING)
        self.save()
        return record

    async def wake(self, name: str) -> EngineRecord:
        async with self.lock(name):
            return await self._wake(self.engines[name])

    async def _wake(self, record: EngineRecord) -> EngineRecord:
        if record.phase != EnginePhase.SLEEPING.value:
            return record
        if not self.launch(record).sleep_api or record.pid is None:  # asleep with no process: started again
            record.sleep_level = None
            self._set(record, EnginePhase.BOOTING)
            await self._spawn(record)
        else:
            if record.engine != "vllm":
                await self._post(record, "/resume_memory_occupation")
            elif record.sleep_level == 2:
                # Level 2 discarded the weights: docs/features/sleep_mode.md wakes them, reloads them in place,
                # then wakes the KV cache.
                await self._post(record, "/wake_up?tags=weights")
                await self._post(record, "/collective_rpc", {"method": "reload_weights"})
                await self._post(record, "/wake_up?tags=kv_cache")
            else:
                await self._post(record, "/wake_up")
            # Booting until the monitor sees it ready (healthy and, for vLLM, /is_sleeping false): wake_up may
            # return before the engine serves again.
            record.ready, record.sleep_level = False, None
            self._set(record, EnginePhase.BOOTING)
        self.save()
        return record

    async def close(self) -> None:
        """Stop watching (engines keep running: a restarted agent re-adopts them) and downloading (a restarted
        agent downloads again)."""
        for name in list(self.downloads):
            self._stop_download(name)
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        await self.client.close()

    async def stop_all(self) -> None:
        for name in list(self.engines):
            await self.deactivate(name)

    # -- processes ---------------------------------------------------------------------------------
    def launch(self, record: EngineRecord) -> Launch:
        python = self.engine_python.get(record.engine)
        artifact = f"file://{record.local_path}" if record.local_path else record.artifact_url
        return launch_command(record.engine, record.model_name, artifact, record.port, record.args, python, self.host)

    # -- artifacts ---------------------------------------------------------------------------------
    def _staged(self, record: EngineRecord) -> bool:
        """Whether the engine can start: its artifact needs no staging, or is staged and still there."""
        if not record.artifact_url.startswith("s3://"):
            return True
        return record.local_path is not None and Path(record.local_path).exists()

    def _stage(self, record: EngineRecord) -> None:
        """Download the engine's artifact in the background (booting meanwhile), then start it."""
        old = self._tasks.pop(record.model_name, None)
        if old is not None:
            old.cancel()
        record.local_path = None
        self._tasks[record.model_name] = asyncio.create_task(
            self._download(record), name=f"download-{record.model_name}"
        )

    async def _download(self, record: EngineRecord) -> None:
        name = record.model_name
        progress = self.downloads[name] = Progress(record.artifact_url)
        log.info("%s: downloading %s", name, record.artifact_url)
        try:
            path = await asyncio.to_thread(fetch_s3, record.artifact_url, self.artifact_root, progress)
        except ArtifactError as exc:
            if self.engines.get(name) is record and not progress.cancelled:
                record.last_error = str(exc)
                self._set(record, EnginePhase.FAILED)
                self.save()
                log.error("%s failed: %s", name, exc)
            return
        finally:
            if self.downloads.get(name) is progress:
                del self.downloads[name]
        if self.engines.get(name) is not record or progress.cancelled:
            return  # deactivated meanwhile
        log.info("%s: %s is in %s (%d bytes)", name, record.artifact_url, path, progress.done)
        record.local_path = str(path)
        if self.cache_dir is not None:  # as AIBrix's runtime does: the node has the weights now
            write_served_marker(self.cache_dir, name, record.artifact_url)
        if self._tasks.get(name) is asyncio.current_task():
            del self._tasks[name]  # _spawn watches the engine under this name; this task ends here
        await self._spawn(record)

    def _stop_download(self, name: str) -> None:
        progress = self.downloads.pop(name, None)
        if progress is not None:
            progress.cancelled = True  # the transfer stops at its next chunk

    async def _spawn(self, record: EngineRecord) -> None:
        if not self._staged(record):
            self._stage(record)
            return
        record.host = self.host  # started again by this agent: where it listens now
        self._free_port(record)
        launch = self.launch(record)
        env = {**os.environ, "ENABLE_KVCACHED": "true", "KVCACHED_AUTOPATCH": "1", "KVCACHED_IPC_NAME": record.ipc_name}
        if record.engine == "vllm":
            env["VLLM_SERVER_DEV_MODE"] = "1"
        pid = _spawn_session(launch.argv, self.log_dir / f"{record.ipc_name}.log", env)
        record.pid, record.pid_start = pid, process_start_time(pid)
        record.ready = False
        self._boot_since[record.model_name] = time.monotonic()
        self._adopted.discard(record.model_name)
        self.save()
        self._watch(record.model_name)

    def _free_port(self, record: EngineRecord) -> None:
        """Before a start: an engine whose port something else took meanwhile moves to a free port of the range
        (see the module's docstring); one whose activation named its port, or with no free port left, stays."""
        if record.port_pinned or port_free(self.host, record.port):
            return
        low, high = self.port_range
        taken = {e.port for e in self.engines.values()}
        while True:
            try:
                port = pick_port(0, low, high, taken)
            except NoCapacity:
                log.warning("%s: port %d is taken and no other is free; started on it", record.model_name, record.port)
                return
            if port_free(self.host, port):
                break
            taken.add(port)
        log.warning("%s: port %d is taken by another process; started on %d", record.model_name, record.port, port)
        record.port = port

    def _watch(self, name: str) -> None:
        old = self._tasks.pop(name, None)
        if old is not None:
            old.cancel()
        self._tasks[name] = asyncio.create_task(self._monitor(name), name=f"engine-{name}")

    async def _monitor(self, name: str) -> None:
        record = self.engines[name]
        while True:
            await asyncio.sleep(self.poll_s)
            if not self._alive(record):
                await self._crashed(record)
                return
            lock = self._locks.get(name)
            if lock is not None and lock.locked():
                continue  # a sleep, wake or stop is under way and sets the phase itself
            if await self._observe(record):
                await self._boot_timed_out(record)
                return

    async def _observe(self, record: EngineRecord) -> bool:
        """One monitor tick for a live engine: follow its sleep state and readiness; True when it is booting
        past its boot timeout. A settled engine's sleep state is read every ``state_poll_s`` only (each probe is
        a line in the engine's access log)."""
        if record.phase == EnginePhase.SLEEPING.value or record.ready:
            now = time.monotonic()
            if now - self._state_checked.get(record.model_name, -self.state_poll_s) < self.state_poll_s:
                return False
            self._state_checked[record.model_name] = now
        if record.phase == EnginePhase.SLEEPING.value:
            if await self._sleep_state(record) is False:  # woken by someone else: ready again once it answers
                record.sleep_level = None
                self._set(record, EnginePhase.BOOTING)
                self.save()
            return False  # a sleeping engine stays sleeping: its /health says nothing about sleep
        if record.ready:
            if await self._sleep_state(record):  # put to sleep by someone else: not routable
                record.ready, record.sleep_level = False, record.sleep_level or 1
                self._set(record, EnginePhase.SLEEPING)
                self.save()
            return False
        if await self._healthy(record) and not await self._sleep_state(record):
            record.ready = True
            self._set(record, EnginePhase.ACTIVE)
            self._adopted.discard(record.model_name)
            self.save()
            return False
        since = self._boot_since.setdefault(record.model_name, time.monotonic())
        return time.monotonic() - since > self.boot_limit(record)[0]

    def boot_limit(self, record: EngineRecord) -> tuple[float, str]:
        """How long the engine may boot (start to answering its health check), and where that comes from."""
        if self.boot_timeout_s is not None:
            return self.boot_timeout_s, "turnout agent --boot-timeout-s"
        launch = self.launch(record)
        return launch.boot_timeout_s, launch.boot_timeout_from

    async def _boot_timed_out(self, record: EngineRecord) -> None:
        """Kill an engine that did not answer its health check within its boot timeout (one a restarted agent
        adopted, or one this agent started or woke) and restart it as a crashed engine is restarted."""
        limit, source = self.boot_limit(record)
        path = self.launch(record).health_path
        started = f"its re-adoption (pid {record.pid})" if record.model_name in self._adopted else "its start"
        why = f"did not answer GET {path} within {limit:g} s of {started}; killed (boot timeout: {source})"
        log.warning("%s %s", record.model_name, why)
        await self._stop_process(record)
        self._adopted.discard(record.model_name)
        await self._crashed(record, why)

    async def _crashed(self, record: EngineRecord, why: str | None = None) -> None:
        """Restart an engine whose process ended (or, with ``why``, that was killed for not booting in time)
        after the backoff; after :data:`MAX_RESTARTS` restarts it is ``failed``."""
        code = self._exit_codes.pop(record.model_name, None)
        if record.pid is not None:
            _kill_group(record.pid)  # leftovers of the old group never outlive a relaunch
        record.pid = record.pid_start = None
        record.ready, record.sleep_level = False, None
        record.last_error = (why or f"engine exited (code {code})") + _tail(self.log_dir / f"{record.ipc_name}.log")
        if record.phase == EnginePhase.SLEEPING.value:
            # Asleep in place, it had given its GPU memory back: restarting it awake would take that memory again
            # behind the controller's back (and may not find it free). It stays asleep with no process, as an
            # engine that sleeps by stopping does, and starts again on wake.
            log.warning("%s exited while asleep; it stays asleep and starts again on wake", record.model_name)
            self.save()
            return
        if record.restarts >= MAX_RESTARTS:  # the counter says restarts made: this crash gets none
            self._set(record, EnginePhase.FAILED)
            log.error("%s failed after %d restarts: %s", record.model_name, record.restarts, record.last_error)
            self.save()
            return
        record.restarts += 1
        self.restarts_total += 1
        self._set(record, EnginePhase.RESTARTING)
        self.save()
        delay = backoff_s(record.restarts, self.backoff_base_s)
        log.warning("%s exited; restart %d in %.1fs", record.model_name, record.restarts, delay)
        await asyncio.sleep(delay)
        self._set(record, EnginePhase.BOOTING)
        await self._spawn(record)

    def _alive(self, record: EngineRecord) -> bool:
        if record.pid is None:
            return False
        try:
            pid, status = os.waitpid(record.pid, os.WNOHANG)  # our own child: reap it when it exits
        except ChildProcessError:
            pid = 0  # adopted from an earlier agent: not our child, judge by /proc
        else:
            if pid:
                self._exit_codes[record.model_name] = os.waitstatus_to_exitcode(status)
                return False
        return process_start_time(record.pid) == record.pid_start

    async def _stop_process(self, record: EngineRecord) -> None:
        if record.pid is not None:
            _kill_group(record.pid, signal.SIGTERM)
            if not await self._exited(record, within_s=10):
                _kill_group(record.pid)
                await self._exited(record, within_s=5)
        self._exit_codes.pop(record.model_name, None)
        record.pid = record.pid_start = None

    async def _exited(self, record: EngineRecord, *, within_s: float) -> bool:
        """Poll (a process exit is not an awaitable event) until the engine is gone or time is up."""
        for _ in range(max(1, int(within_s / 0.05))):
            if not self._alive(record):
                return True
            await asyncio.sleep(0.05)
        return not self._alive(record)

    def url(self, record: EngineRecord, path: str) -> str:
        reach = connect_host(record.host or self.host)  # a wildcard bind is reached on loopback
        return f"http://{host_port(reach, record.port)}{path}"

    async def _healthy(self, record: EngineRecord) -> bool:
        """Its health check answers 200, from its own process: a port that another process bound between the
        agent's check and the engine's bind answers for someone else (:mod:`turnout.runtime.ports`)."""
        launch = self.launch(record)
        try:
            async with self.client.request(
                "GET", self.url(record, launch.health_path), label=record.model_name, timeout_s=launch.health_timeout_s
            ) as resp:
                await resp.read()
                if resp.status != 200:
                    return False
        except Exception:  # any failure to answer means not ready
            return False
        if record.pid is None or listens_on(record.pid, record.port) is not False:
            return True
        if self._foreign_port.get(record.model_name) != record.pid:  # said once per process
            self._foreign_port[record.model_name] = record.pid
            log.warning(
                "%s: port %d answers, but another process listens there, not the engine (pid %d); not ready",
                record.model_name,
                record.port,
                record.pid,
            )
        return False

    async def _sleep_state(self, record: EngineRecord) -> bool | None:
        """vLLM's ``GET /is_sleeping`` (``{"is_sleeping": bool}``); None when the engine has no such route or
        does not answer it."""
        path = self.launch(record).sleep_state_path
        if path is None:
            return None
        try:
            async with self.client.request("GET", self.url(record, path), label=record.model_name, timeout_s=2) as r:
                body = await r.read()
                state = json.loads(body).get("is_sleeping") if r.status == 200 else None
        except Exception:  # an engine that cannot answer says nothing about its sleep
            return None
        return state if isinstance(state, bool) else None

    async def fetch_text(self, record: EngineRecord, path: str) -> str | None:
        """GET a text document from the engine (its metrics), or None when it does not answer 200."""
        try:
            async with self.client.request("GET", self.url(record, path), label=record.model_name, timeout_s=2) as resp:
                body = await resp.read()
                return body.decode("utf-8", "replace") if resp.status == 200 else None
        except Exception:  # an engine that cannot answer has no observable activity
            return None

    async def _post(self, record: EngineRecord, path: str, body: dict[str, Any] | None = None) -> None:
        async with self.client.request(
            "POST",
            self.url(record, path),
            label=record.model_name,
            body=json.dumps(body or {}).encode(),
            headers={"Content-Type": "application/json"},
            timeout_s=60,
        ) as r:
            await r.read()
            if r.status >= 300:
                raise RuntimeError(f"{record.engine} answered HTTP {r.status} to {path}")

    def _set(self, record: EngineRecord, phase: EnginePhase) -> None:
        if record.phase != phase.value:
            record.phase = phase.value
            record.last_transition = time.time()
            if phase is EnginePhase.BOOTING:  # a wake in place, or a restart: its boot timeout starts now
                self._boot_since[record.model_name] = time.monotonic()


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _spawn_session(argv: list[str], log_path: Path, env: dict[str, str]) -> int:
    """Start an engine in its own session (process group) with output to its log; returns the PID.

    posix_spawn rather than Popen: the agent tracks engines by PID (they outlive an agent restart), so no
    Popen object is left to complain about a child it no longer owns."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)


def _kill_group(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tail(path: Path, limit: int = 300) -> str:
    try:
        text = path.read_bytes()[-limit:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f": ...{text.splitlines()[-1]}" if text else ""
