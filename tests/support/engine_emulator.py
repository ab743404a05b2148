"""Stand-ins for the vLLM and SGLang HTTP servers (neither runs on this machine's CPU with sleep mode or at all),
for tests only. Run as the agent runs an engine: ``python -m tests.support.engine_emulator -m MODULE ARGS...``,
where MODULE is ``vllm.entrypoints.openai.api_server`` or ``sglang.launch_server`` (the runtime tests give the
agent an ``--engine-python`` wrapper that does this). ``-c CODE`` runs the code, as the interpreter it stands in
for would (the agent asks an engine's interpreter this way whether it can import kvcached; the wrapper's
``EMULATOR_PYTHONPATH`` adds to its path, e.g. a directory holding a ``kvcached`` package).

What each follows, from the upstream source:

vLLM
- ``GET /health`` is 200 while the engine lives, also while it sleeps; 503 only when the engine is dead
  (vllm/entrypoints/serve/instrumentator/health.py: ``check_health`` raises only ``EngineDeadError``).
- ``POST /sleep?level=N&mode=M`` (level 0-2, mode abort|wait|keep, else 422; answers
  ``{"status": "sleeping", "level": N}``), ``POST /wake_up[?tags=T...]`` (answers ``{"status": "awake"|"sleeping",
  "tags": ...}``), ``GET /is_sleeping`` -> ``{"is_sleeping": b}`` and ``POST /collective_rpc`` exist only with
  ``VLLM_SERVER_DEV_MODE=1`` (as in vLLM 0.32.0, the version scripts/vllm-venv installs)
  (vllm/entrypoints/serve/dev/sleep/api_router.py, registered by ``register_vllm_dev_api_routers`` under
  ``if envs.VLLM_SERVER_DEV_MODE``). Level 1 offloads the weights and discards the KV cache; level 2 discards
  both, so waking needs ``wake_up?tags=weights``, ``collective_rpc {"method": "reload_weights"}``,
  ``wake_up?tags=kv_cache`` (docs/features/sleep_mode.md); ``is_sleeping`` stays true until every tag is awake.
  A level-2 engine woken without the reload answers with garbage, as the real one would.
- ``/metrics``: ``vllm:num_requests_running|waiting`` gauges and ``vllm:request_success_total`` counter with
  labels ``model_name`` (the served model name) and ``engine`` (vllm/v1/metrics/loggers.py).
- ``EMULATOR_WAKE_LAG_S``: seconds ``is_sleeping`` stays true after ``/wake_up`` returned (upstream's
  "the wake-up command is sent but does not finish yet when we return a response").
- Scheduling (vLLM 0.32.0): at most ``--max-num-seqs`` requests run at once (default 128:
  vllm/config/scheduler.py ``DEFAULT_MAX_NUM_SEQS``); the others wait. ``--scheduling-policy`` is ``fcfs`` (the
  default: waiting requests start in arrival order) or ``priority`` (vllm/v1/core/sched/request_queue.py
  ``PriorityRequestQueue``: the lowest ``(priority, arrival time)`` first, vllm/v1/request.py ``Request.__lt__``).
  A request's priority is the ``X-Vllm-Priority`` header where it holds an integer, else the body's ``priority``
  (vllm/entrypoints/generate/base/serving.py ``_get_priority``; default 0); a body ``priority`` that is not an
  integer in the int64 range is a 400 validation error (vllm/entrypoints/openai/chat_completion/protocol.py,
  vllm/entrypoints/serve/exception_handling/handlers/validation.py). Under ``fcfs`` the priority is read and has
  no effect (0.32.0 no longer refuses a non-zero one; vLLM's old V0 engine did). Not modelled: preemption of a
  running request when KV cache blocks run out (vllm/v1/core/sched/scheduler.py), which under ``priority`` takes
  the lowest-priority one. ``EMULATOR_HOLD=1`` keeps every started request running until the test ends the
  oldest one (``POST /emulator/step``); ``GET /emulator/calls`` lists, in start order, each request's label (its
  last message's content), the priority it ran at and what the header and body said.
- Start-up: the port is bound at once, but only listened on once the engine is built
  (vllm/entrypoints/openai/api_server.py: ``setup_server`` binds the socket "before the engine is set up",
  ``build_async_engine_client`` loads the model, then ``serve_http`` starts serving on that socket), so while
  it boots a connection is refused. ``EMULATOR_BOOT_S`` sets how long that takes here (default 0).

SGLang (python/sglang/srt/entrypoints/http_server.py)
- ``GET /health`` is 503 while the server starts, then runs a one-token generation and answers 200 once the
  scheduler replied, checking every second (so never under 1 s; up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` = 20 s).
  ``EMULATOR_HEALTH_S`` sets how long it takes here (default 3 s).
- ``/metrics`` exists only with ``--enable-metrics`` (``add_prometheus_middleware``); series
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:num_requests_total`` labelled ``model_name``
  (python/sglang/srt/metrics/collector.py).
- ``POST /release_memory_occupation``, ``POST /resume_memory_occupation``.

Both: OpenAI ``/v1/models`` and ``/v1/chat/completions``; ``GET /emulator/calls`` (the emulator's own route,
for assertions) lists the control calls received and counts the probes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

VLLM = "vllm.entrypoints.openai.api_server"
SGLANG = "sglang.launch_server"
TAGS = ("weights", "kv_cache")
PRIORITY_HEADER = "X-Vllm-Priority"  # vllm/entrypoints/generate/base/serving.py
INT64 = (-(2**63), 2**63 - 1)
DEFAULT_MAX_NUM_SEQS = 128


@dataclass(eq=False)
class Scheduled:
    """One request in the engine: waiting, then running until it ends."""

    label: str
    priority: int
    arrival: int
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    said: dict[str, Any] = field(default_factory=dict)  # what the header and body said


class Engine:
    def __init__(
        self,
        kind: str,
        model: str,
        sleep_mode: bool,
        metrics: bool,
        *,
        policy: str = "fcfs",
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        hold: bool = False,
    ) -> None:
        self.kind, self.model, self.sleep_mode, self.metrics = kind, model, sleep_mode, metrics
        self.policy, self.max_num_seqs, self.hold = policy, max_num_seqs, hold
        self.waiting: list[Scheduled] = []
        self.running: list[Scheduled] = []
        self.started_log: list[dict[str, Any]] = []
        self._arrivals = itertools.count()
        self.started = time.monotonic()
        self.asleep: set[str] = set()  # memory tags asleep
        self.paused = False  # level 0: scheduling paused, memory kept (is_sleeping is true all the same)
        self.weights_valid = True  # false after a level-2 sleep until reload_weights
        self.awake_at = 0.0  # monotonic time is_sleeping turns false after a wake
        self.calls: list[str] = []
        self.probes = 0
        self.completed = 0

    def is_sleeping(self) -> bool:
        return bool(self.asleep) or self.paused or time.monotonic() < self.awake_at

    async def run(self, label: str, priority: int, said: dict[str, Any]) -> None:
        """Wait for a place among the running requests (by the policy), run, end."""
        request = Scheduled(label, priority, next(self._arrivals), said=said)
        self.waiting.append(request)
        self._schedule()
        try:
            await request.started.wait()
            if self.hold:
                await request.ended.wait()
        finally:
            if request in self.waiting:
                self.waiting.remove(request)
            if request in self.running:
                self.running.remove(request)
            self._schedule()

    def _schedule(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            if self.policy == "priority":  # the lowest (priority, arrival) first
                chosen = min(self.waiting, key=lambda r: (r.priority, r.arrival))
            else:  # first come, first served
                chosen = self.waiting[0]
            self.waiting.remove(chosen)
            self.running.append(chosen)
            self.started_log.append({"label": chosen.label, "priority": chosen.priority, **chosen.said})
            chosen.started.set()

    def step(self) -> str | None:
        """End the oldest running request (``EMULATOR_HOLD``); its label."""
        if not self.running:
            return None
        oldest = self.running[0]
        oldest.ended.set()
        return oldest.label


def request_priority(request: web.Request, body: dict[str, Any]) -> int | web.Response:
    """The header's integer, else the body's (0 when neither); a body value that is no int64: vLLM's 400."""
    raw = body.get("priority", 0)
    if isinstance(raw, bool) or not isinstance(raw, int) or not INT64[0] <= raw <= INT64[1]:
        error = {"message": "priority: Input should be a valid integer", "type": "BadRequestError"}
        return web.json_response({"error": {**error, "param": "body.priority", "code": 400}}, status=400)
    header = request.headers.get(PRIORITY_HEADER)
    if header is not None:
        try:
            return int(header)
        except ValueError:
            pass
    return raw


def _label(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content", ""))
    return str(body.get("prompt", body.get("input", "")))


def chat_answer(engine: Engine, model: str) -> dict[str, Any]:
    text = "hello" if engine.weights_valid else "\x00garbage: weights discarded at level 2 and never reloaded"
    return {
        "id": "chatcmpl-emulator",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def build_app(engine: Engine, dev_mode: bool) -> web.Application:
    app = web.Application()
    r = app.router

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": engine.model, "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if engine.asleep or engine.paused:  # nothing is scheduled: no weights or KV cache, or paused
            return web.json_response({"error": {"message": "engine is sleeping", "code": 503}}, status=503)
        if engine.kind == VLLM:
            priority = request_priority(request, body)
            if isinstance(priority, web.Response):
                return priority
            said = {"header": request.headers.get(PRIORITY_HEADER), "body": body.get("priority")}
            await engine.run(_label(body), priority, said)
        engine.completed += 1
        return web.json_response(chat_answer(engine, str(body.get("model", engine.model))))

    async def calls(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "calls": engine.calls,
                "probes": engine.probes,
                "started": engine.started_log,
                "waiting": len(engine.waiting),
                "running": len(engine.running),
            }
        )

    async def step(request: web.Request) -> web.Response:
        return web.json_response({"ended": engine.step()})

    r.add_get("/v1/models", models)
    r.add_post("/v1/chat/completions", chat)
    r.add_get("/emulator/calls", calls)
    r.add_post("/emulator/step", step)
    if engine.kind == VLLM:
        add_vllm_routes(app, engine, dev_mode)
    else:
        add_sglang_routes(app, engine)
    return app


def add_vllm_routes(app: web.Application, engine: Engine, dev_mode: bool) -> None:
    r = app.router

    async def health(request: web.Request) -> web.Response:
        engine.probes += 1
        return web.Response(status=200)  # alive, asleep or not

    async def metrics(request: web.Request) -> web.Response:
        labels = f'engine="0",model_name="{engine.model}"'
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {float(len(engine.running))}\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {float(len(engine.waiting))}\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {float(engine.completed)}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    if not dev_mode:
        return

    async def sleep(request: web.Request) -> web.Response:
        engine.calls.append(request.path_qs)
        if not engine.sleep_mode:
            return web.json_response({"error": "sleep mode is not enabled (--enable-sleep-mode)"}, status=500)
        level, mode = request.query.get("level", "1"), request.query.get("mode", "abort")
        if level not in ("0", "1", "2") or mode not in ("abort", "wait", "keep"):
            return web.json_response({"detail": [{"loc": ["query"], "msg": "invalid level or mode"}]}, status=422)
        engine.paused = True
        if level != "0":  # level 0 only pauses scheduling
            engine.asleep = set(TAGS)
        if level == "2":
            engine.weights_valid = False
        return web.json_response({"status": "sleeping", "level": int(level)})

    async def wake_up(request: web.Request) -> web.Response:
        engine.calls.append(request.path_qs)
        tags = request.query.getall("tags", [])
        engine.asleep -= set(tags or TAGS)
        if not engine.asleep:
            engine.paused = False
            engine.awake_at = time.monotonic() + float(os.environ.get("EMULATOR_WAKE_LAG_S", "0"))
        return web.json_response({"status": "sleeping" if engine.asleep else "awake", "tags": tags or None})

    async def is_sleeping(request: web.Request) -> web.Response:
        engine.probes += 1
        return web.json_response({"is_sleeping": engine.is_sleeping()})

    async def collective_rpc(request: web.Request) -> web.Response:
        body = await request.json()
        engine.calls.append(f"{request.path_qs} {body.get('method')}")
        if body.get("method") == "reload_weights" and "weights" not in engine.asleep:
            engine.weights_valid = True
        return web.json_response({"results": [None]})

    r.add_post("/sleep", sleep)
    r.add_post("/wake_up", wake_up)
    r.add_get("/is_sleeping", is_sleeping)
    r.add_post("/collective_rpc", collective_rpc)


def add_sglang_routes(app: web.Application, engine: Engine) -> None:
    r = app.router

    async def health(request: web.Request) -> web.Response:
        engine.probes += 1
        if time.monotonic() - engine.started < 0.3:
            return web.Response(status=503)  # ServerStatus.Starting
        await asyncio.sleep(float(os.environ.get("EMULATOR_HEALTH_S", "3")))  # the one-token generation
        return web.Response(status=200)

    async def metrics(request: web.Request) -> web.Response:
        labels = f'model_name="{engine.model}"'
        text = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f"sglang:num_running_reqs{{{labels}}} 0.0\n"
            "# TYPE sglang:num_queue_reqs gauge\n"
            f"sglang:num_queue_reqs{{{labels}}} 0.0\n"
            "# TYPE sglang:num_requests_total counter\n"
            f"sglang:num_requests_total{{{labels}}} {float(engine.completed)}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def release(request: web.Request) -> web.Response:
        engine.calls.append(request.path_qs)
        engine.asleep = set(TAGS)
        return web.json_response({})

    async def resume(request: web.Request) -> web.Response:
        engine.calls.append(request.path_qs)
        engine.asleep = set()
        return web.json_response({})

    r.add_get("/health", health)
    r.add_get("/health_generate", health)
    if engine.metrics:
        r.add_get("/metrics", metrics)
    r.add_post("/release_memory_occupation", release)
    r.add_post("/resume_memory_occupation", resume)


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "-c":  # run as the engine's interpreter is (the agent's kvcached question)
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        return
    if len(argv) < 2 or argv[0] != "-m" or argv[1] not in (VLLM, SGLANG):
        raise SystemExit(f"usage: engine_emulator -m {VLLM}|{SGLANG} ARGS...; got {argv[:2]}")
    kind = argv[1]
    parser = argparse.ArgumentParser()
    parser.add_argument("--model" if kind == VLLM else "--model-path", dest="model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--enable-metrics", action="store_true")
    if kind == VLLM:  # vllm/engine/arg_utils.py: SchedulerConfig.policy is Literal["fcfs", "priority"]
        parser.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs")
        parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS)
    args, _ = parser.parse_known_args(argv[2:])  # engine flags the emulator does not model
    engine = Engine(
        kind,
        args.served_model_name or args.model,
        args.enable_sleep_mode,
        args.enable_metrics,
        policy=getattr(args, "scheduling_policy", "fcfs"),
        max_num_seqs=getattr(args, "max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        hold=os.environ.get("EMULATOR_HOLD") == "1",
    )
    app = build_app(engine, os.environ.get("VLLM_SERVER_DEV_MODE") == "1")
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))  # bound, not listening: connections are refused while the engine builds
    print(f"emulating {kind} for {engine.model} on {args.host}:{args.port}", flush=True)
    if kind == VLLM:
        time.sleep(float(os.environ.get("EMULATOR_BOOT_S", "0")))  # loading the model, in the stand-in's own process
    web.run_app(app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
