"""The runtime agent's HTTP API (`turnout agent`), AIBrix's runtime API (see :mod:`turnout.runtime.wire`).

``POST /v1/runtime/models/activate|deactivate|kv-limit|sleep|wake``, ``GET /v1/runtime/models``,
``GET /v1/runtime/snapshot``, ``GET /healthz``, ``GET /metrics``. ``kv-limit``, ``sleep`` and ``wake`` need an
``operation_id`` (as AIBrix's runtime does); a repeated id is not carried out again and is answered
``applied: false``. ``activate`` is idempotent by model name (an ``operation_id`` there, optional, gets the
first answer again). Errors: 400 invalid, 404 unknown model, 409 the engine cannot do that now,
or no port or IPC name is free.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from turnout.core.runtime import ActivateRequest, EnginePhase, InvalidRequest, NoCapacity
from turnout.errors import BadRequest, Conflict, NotFound, TurnoutError
from turnout.redaction import handler_args
from turnout.responses import Dialect, error_response, json_response
from turnout.runtime.artifacts import boto3_missing
from turnout.runtime.cache import cached_artifacts, write_served_marker
from turnout.runtime.kvcached import apply_limit, read_usage
from turnout.runtime.mock import MockSupervisor
from turnout.runtime.nvml import Nvml, group_pids
from turnout.runtime.supervisor import EngineRecord, Supervisor
from turnout.runtime.wire import activate_result, iso, list_entry, operation_result, snapshot_model

__all__ = ["create_agent_app"]

SUPERVISOR: web.AppKey[Supervisor] = web.AppKey("supervisor")
_OPS_KEPT = 1000
_NO_ACTIVITY: dict[str, int | None] = {"running": None, "waiting": None, "success_total": None}


def _metric_key(name: str) -> str:
    """``vllm:num_requests_running`` and ``vllm_num_requests_running`` are the same series: exporters and
    scrapers that do not keep colons in names (OpenMetrics-only pipelines, some vLLM builds) write the
    underscore spelling."""
    return name.replace(":", "_")


def activity_from_metrics(text: str, names: tuple[str, str, str], model: str) -> dict[str, int | None]:
    """Running, waiting and completed requests of ``model`` in a Prometheus exposition: the samples named
    ``names`` (either spelling) whose ``model_name`` label is ``model`` (vLLM's label: vllm/v1/metrics/loggers.py;
    SGLang's: python/sglang/srt/metrics/collector.py), summed over the other labels. None where absent."""
    keys = [_metric_key(n) for n in names]
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = _metric_key(sample.name)
                if key in keys and sample.labels.get("model_name") == model:
                    sums[key] = sums.get(key, 0.0) + sample.value
    except ValueError:
        return dict(_NO_ACTIVITY)
    running, waiting, done = (None if k not in sums else int(sums[k]) for k in keys)
    return {"running": running, "waiting": waiting, "success_total": done}


async def engine_activity(supervisor: Supervisor, record: EngineRecord) -> dict[str, int | None]:
    """Running, waiting and completed requests from the engine's own /metrics; None where not observable
    (an engine without metrics, such as llama.cpp's Python server, or one that is not ready)."""
    names = supervisor.launch(record).activity
    if names is None or not record.ready:
        return dict(_NO_ACTIVITY)
    text = await supervisor.fetch_text(record, "/metrics")
    if text is None:
        return dict(_NO_ACTIVITY)
    return activity_from_metrics(text, names, record.model_name)


class _Operations:
    """Operation ids already carried out, per operation and model (bounded), with the first answer."""

    def __init__(self) -> None:
        self._done: OrderedDict[tuple[str, str, str], Any] = OrderedDict()

    def get(self, key: tuple[str, str, str]) -> Any:
        return self._done.get(key)

    def put(self, key: tuple[str, str, str], body: Any) -> None:
        self._done[key] = body
        while len(self._done) > _OPS_KEPT:
            self._done.popitem(last=False)


class _Metrics:
    """The agent's own series (AIBrix's names), in their own registry."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.resident = Gauge(
            "aibrix:modelclaim_models_resident", "engines holding their model: active or sleeping", registry=registry
        )
        self.kv_used = Gauge("aibrix:modelclaim_kv_used_bytes", "kvcached bytes in use", ["model"], registry=registry)
        self.kv_total = Gauge("aibrix:modelclaim_kv_total_bytes", "kvcached capacity", ["model"], registry=registry)
        self.hbm_peak = Gauge(
            "aibrix:modelclaim_hbm_peak_bytes", "best-effort peak device memory", ["model"], registry=registry
        )
        self.restarts = Gauge(
            "aibrix:modelclaim_engine_restarts", "restarts of the engine", ["model"], registry=registry
        )
        self.lifecycle = Counter(
            "aibrix:modelclaim_lifecycle_operations", "agent operations", ["operation", "result"], registry=registry
        )


def _model_of(body: dict[str, Any]) -> str:
    name = body.get("model_name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model_name is required")
    return name


class _AgentApi:
    """The handlers of :func:`create_agent_app`, over one supervisor."""

    def __init__(self, supervisor: Supervisor, gpu: Nvml, *, shm_dir: Path, cache_dir: Path | None, mock: bool) -> None:
        self.supervisor = supervisor
        self.gpu = gpu
        self.shm_dir = shm_dir
        self.cache_dir = cache_dir
        self.mock = mock
        self.peaks: dict[str, int] = {}  # model -> highest device memory its process group was seen holding
        self.ops = _Operations()
        self.metrics_ = _Metrics()

    # -- what the engines hold and do -----------------------------------------------------------------
    def peak_of(self, record: EngineRecord, per_pid: dict[int, int]) -> int | None:
        """Best effort: NVML's per-process memory summed over the engine's process group, kept as a peak."""
        if not self.gpu.available:
            return None
        if record.pid is not None:
            now = sum(per_pid.get(pid, 0) for pid in group_pids(record.pid))
            self.peaks[record.model_name] = max(self.peaks.get(record.model_name, 0), now)
        return self.peaks.get(record.model_name, 0)

    def describe(
        self,
        record: EngineRecord,
        requests: dict[str, int | None] | None = None,
        per_pid: dict[int, int] | None = None,
    ) -> dict[str, Any]:
        download = self.supervisor.downloads.get(record.model_name)
        return snapshot_model(
            record,
            read_usage(record.ipc_name, self.shm_dir),
            requests or dict(_NO_ACTIVITY),
            self.peak_of(record, per_pid if per_pid is not None else self.gpu.process_memory()),
            None if download is None else download.to_json(),
        )

    async def describe_all(self) -> list[dict[str, Any]]:
        records = list(self.supervisor.engines.values())
        activity = await asyncio.gather(*(engine_activity(self.supervisor, r) for r in records))
        per_pid = self.gpu.process_memory()
        return [self.describe(r, a, per_pid) for r, a in zip(records, activity, strict=True)]

    # -- operations ------------------------------------------------------------------------------------
    def operation(
        self, name: str, fn: Callable[[dict[str, Any], str | None], Awaitable[Any]], *, needs_id: bool = True
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler of one operation: its body checked, a repeated ``operation_id`` answered without carrying
        it out again, every outcome counted and answered in the agent's error shape."""

        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                body = orjson.loads(await request.read() or b"{}")
            except orjson.JSONDecodeError as exc:
                return error_response(Dialect.ADMIN, BadRequest(f"body is not valid JSON: {exc}"))
            if not isinstance(body, dict):
                return error_response(Dialect.ADMIN, BadRequest("body must be a JSON object"))
            op = body.get("operation_id")
            if op is not None and not isinstance(op, str):
                return error_response(Dialect.ADMIN, BadRequest("operation_id must be a string"))
            if needs_id and not op:
                return error_response(
                    Dialect.ADMIN,
                    BadRequest(f"operation_id is required for {name}: a unique string per operation (AIBrix API)"),
                )
            return await self._carry_out(name, fn, body, op, needs_id)

        return handler

    async def _carry_out(
        self,
        name: str,
        fn: Callable[[dict[str, Any], str | None], Awaitable[Any]],
        body: dict[str, Any],
        op: str | None,
        needs_id: bool,
    ) -> web.StreamResponse:
        lifecycle = self.metrics_.lifecycle
        try:
            key = (name, _model_of(body), op) if op else None
            remembered = None if key is None else self.ops.get(key)
            if key is not None and remembered is not None:  # carried out already: not again
                lifecycle.labels(name, "skipped").inc()
                if not needs_id:
                    return json_response(remembered)
                record = self.supervisor.engines[key[1]]
                return json_response(operation_result(record.model_name, key[2], False, record.phase))
            result = await fn(body, op)
        except InvalidRequest as exc:
            lifecycle.labels(name, "invalid").inc()
            return error_response(Dialect.ADMIN, BadRequest(str(exc)))
        except NoCapacity as exc:  # valid, but not now: never a terminal refusal of the claim
            lifecycle.labels(name, "refused").inc()
            return error_response(Dialect.ADMIN, Conflict(str(exc), code="no_capacity"))
        except KeyError as exc:
            lifecycle.labels(name, "not_found").inc()
            return error_response(Dialect.ADMIN, NotFound(f"no engine for model {exc.args[0]!r}"))
        except TurnoutError as exc:
            lifecycle.labels(name, "refused").inc()
            return error_response(Dialect.ADMIN, exc)
        except (RuntimeError, OSError, ValueError) as exc:
            lifecycle.labels(name, "failed").inc()
            return error_response(Dialect.ADMIN, Conflict(str(exc), code="engine_refused"))
        lifecycle.labels(name, "ok").inc()
        if key is not None:
            self.ops.put(key, result)
        return json_response(result)

    async def activate(self, body: dict[str, Any], op: str | None) -> Any:
        req = ActivateRequest.parse(body)
        staged = req.artifact_url.startswith("s3://") and not self.mock
        if staged and req.model_name not in self.supervisor.engines and (missing := boto3_missing()) is not None:
            raise InvalidRequest(missing)
        record = await self.supervisor.activate(req)
        # as AIBrix's runtime does: the weights stay cached after deactivation (a download is marked once complete)
        if self.cache_dir is not None and not staged:
            write_served_marker(self.cache_dir, record.model_name, record.artifact_url)
        return activate_result(record)

    async def deactivate(self, body: dict[str, Any], op: str | None) -> Any:
        name = _model_of(body)
        mode = body.get("mode", "stop")
        if mode != "stop":
            raise InvalidRequest(f'mode must be "stop" (the only deactivation there is), got {mode!r}')
        await self.supervisor.deactivate(name)
        self.peaks.pop(name, None)  # a later engine of the same name starts its own peak
        return {"status": "success", "model_name": name, "deactivated": True}

    async def sleep(self, body: dict[str, Any], op: str | None) -> Any:
        name = _model_of(body)
        level = body.get("level", 1)
        if level not in (1, 2) or isinstance(level, bool):
            raise InvalidRequest("level must be 1 or 2")
        record = self.supervisor.engines[name]
        if record.phase not in (EnginePhase.ACTIVE.value, EnginePhase.SLEEPING.value):
            raise Conflict(f"{name} is {record.phase}; only an active engine can sleep", code="engine_not_active")
        applied = record.phase != EnginePhase.SLEEPING.value
        record = await self.supervisor.sleep(name, int(level))
        return operation_result(name, str(op), applied, record.phase)

    async def wake(self, body: dict[str, Any], op: str | None) -> Any:
        name = _model_of(body)
        record = self.supervisor.engines[name]
        if record.phase == EnginePhase.FAILED.value:
            raise Conflict(
                f"{name} failed ({record.last_error}); deactivate and activate it again", code="engine_failed"
            )
        applied = record.phase == EnginePhase.SLEEPING.value
        record = await self.supervisor.wake(name)
        return operation_result(name, str(op), applied, record.phase)

    async def kv_limit(self, body: dict[str, Any], op: str | None) -> Any:
        name = _model_of(body)
        limit = body.get("limit_bytes")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise InvalidRequest("limit_bytes must be a non-negative integer")
        record = self.supervisor.engines[name]
        if isinstance(self.supervisor, MockSupervisor):
            # no kvcached segment: remembered, as AIBrix's MockKVController does
            self.supervisor.kv_limits[name] = limit
        else:
            apply_limit(record.ipc_name, limit, self.shm_dir)
        return operation_result(name, str(op), True, record.phase)

    # -- reads -----------------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        return json_response({"models": [list_entry(m) for m in await self.describe_all()]})

    async def snapshot(self, request: web.Request) -> web.Response:
        models = await self.describe_all()
        return json_response(
            {
                "observed_at": iso(time.time()),
                "accelerators": self.gpu.accelerators(),  # [] without NVML
                "models": models,
                "cached_artifacts": [] if self.cache_dir is None else cached_artifacts(self.cache_dir),
            }
        )

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "engines": len(self.supervisor.engines), "mock": self.mock})

    async def metrics(self, request: web.Request) -> web.Response:
        m = self.metrics_
        held = (EnginePhase.ACTIVE.value, EnginePhase.SLEEPING.value)
        m.resident.set(sum(1 for r in self.supervisor.engines.values() if r.phase in held))
        for gauge in (m.kv_used, m.kv_total, m.hbm_peak, m.restarts):
            gauge.clear()  # a deactivated engine's series go with it
        for record in self.supervisor.engines.values():
            usage = read_usage(record.ipc_name, self.shm_dir)
            m.restarts.labels(record.model_name).set(record.restarts)
            peak = self.peaks.get(record.model_name)
            if peak is not None:
                m.hbm_peak.labels(record.model_name).set(peak)
            if usage is not None:
                m.kv_used.labels(record.model_name).set(usage.used + usage.prealloc)
                m.kv_total.labels(record.model_name).set(usage.total)
        return web.Response(body=generate_latest(m.registry), headers={"Content-Type": "text/plain; version=0.0.4"})


def create_agent_app(
    *,
    registry_path: Path,
    log_dir: Path,
    port_range: tuple[int, int],
    cache_dir: Path | None = None,
    shm_dir: Path = Path("/dev/shm"),
    backoff_base_s: float = 2.0,
    nvml: Nvml | None = None,
    engine_python: dict[str, str] | None = None,
    engine_host: str = "127.0.0.1",
    state_poll_s: float = 5.0,
    mock: bool = False,
    boot_timeout_s: float | None = None,
) -> web.Application:
    """The agent's application. ``engine_host`` is where engines listen: the address the agent itself is bound
    to, so that what reaches the agent (the controller, the gateway) reaches its engines too. ``state_poll_s``:
    how often the sleep state of a ready or sleeping engine is read (vLLM's ``/is_sleeping``). ``mock`` answers
    the same API without launching engines (:mod:`turnout.runtime.mock`). ``boot_timeout_s``: how long an engine
    may take to answer its health check after it starts (or is adopted) before it is killed and restarted; None:
    each engine's own boot timeout (:class:`turnout.runtime.launch.Launch`)."""
    gpu = nvml if nvml is not None else Nvml()
    supervisor = (MockSupervisor if mock else Supervisor)(
        registry_path,
        log_dir,
        port_range=port_range,
        backoff_base_s=backoff_base_s,
        engine_python=engine_python,
        host=engine_host,
        state_poll_s=state_poll_s,
        boot_timeout_s=boot_timeout_s,
        gpus=len(gpu.accelerators()),
        cache_dir=cache_dir,
    )
    api = _AgentApi(supervisor, gpu, shm_dir=shm_dir, cache_dir=cache_dir, mock=mock)
    app = web.Application(handler_args=handler_args())  # server and access logs that never print a secret
    app[SUPERVISOR] = supervisor
    r = app.router
    r.add_post("/v1/runtime/models/activate", api.operation("activate", api.activate, needs_id=False))
    r.add_post("/v1/runtime/models/deactivate", api.operation("deactivate", api.deactivate, needs_id=False))
    r.add_post("/v1/runtime/models/sleep", api.operation("sleep", api.sleep))
    r.add_post("/v1/runtime/models/wake", api.operation("wake", api.wake))
    r.add_post("/v1/runtime/models/kv-limit", api.operation("kv-limit", api.kv_limit))
    r.add_get("/v1/runtime/models", api.models)
    r.add_get("/v1/runtime/snapshot", api.snapshot)
    r.add_get("/healthz", api.healthz)
    r.add_get("/metrics", api.metrics)

    async def lifecycle_ctx(app: web.Application) -> AsyncIterator[None]:
        await supervisor.recover()
        yield
        await supervisor.close()

    app.cleanup_ctx.append(lifecycle_ctx)
    return app
