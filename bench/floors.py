"""What the HTTP server layer alone costs: the floor under Turnout's CPU per request.

Two servers that answer every POST with the same small JSON document, without any upstream, measured beside
Turnout's full path in one run (same load, same pinning and CPU accounting as ``bench/run.py``):

- **raw asyncio + httptools**: an ``asyncio.Protocol`` on uvloop parsing with httptools (the parser Turnout's
  upstream client uses), one task per request, the answer written as prepared bytes: about the least a Python
  server can spend;
- **aiohttp web app**: one aiohttp route that reads the body and returns ``web.Response``, on uvloop, no
  access log: the server layer Turnout's client routes run on today;
- **turnout**: ``turnout serve`` in front of the mock upstream, the full path (key, limits, routing, usage,
  metrics), as the **turnout** row of ``bench/run.py``.

The difference between the first two is what a lean server for the client routes could save at most; the
difference between the aiohttp row and Turnout's is Turnout's own work plus its upstream call.

    python bench/floors.py [--duration 3] [--rounds 3] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import run as bench

ANSWER = (
    b'{"id":"floor","object":"chat.completion","created":0,"model":"mock","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)


def serve_raw(port: int) -> None:
    import httptools
    import uvloop

    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(ANSWER),
        ANSWER,
    )

    class Floor(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            self.body.clear()
            asyncio.get_running_loop().create_task(self.answer())

        async def answer(self) -> None:
            self.transport.write(reply)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Floor, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def serve_aiohttp(port: int) -> None:
    import uvloop
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=uvloop.new_event_loop())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per cell and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, targets interleaved; medians reported")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        kind, port = args.serve
        {"raw": serve_raw, "aiohttp": serve_aiohttp}[kind](int(port))
        return
    wrk, pin, load = bench.pinned_wrk()
    tmp = Path(tempfile.mkdtemp(prefix="turnout-floors-"))
    procs: list[Any] = []
    try:
        mock_url = bench.start_mock(procs, load)
        targets = []
        for kind, name in (("raw", "raw asyncio + httptools"), ("aiohttp", "aiohttp web app")):
            port = bench.free_port()
            procs.append(bench.start([sys.executable, __file__, "--serve", kind, str(port)], cpus=pin))
            targets.append(bench.Target(name, f"http://127.0.0.1:{port}", procs[-1]))
            bench.wait_ready(targets[-1].url, procs[-1])
        turnout = bench.start_turnout("turnout (full path)", tmp / "turnout", mock_url, procs, None, cpus=pin)
        bench.wait_ready(turnout.url, turnout.proc, turnout.key)
        targets.append(turnout)
        cells: dict[str, list[dict[str, float]]] = {t.name: [] for t in targets}
        for round_ in range(args.rounds):
            for target in targets:
                got = bench.run_wrk(wrk, target, False, args.concurrency, args.duration, tmp, mock_url)
                cells[target.name].append(got)
                print(f"  round {round_ + 1} {target.name:26} {bench._us(got):6.0f} us CPU/req", file=sys.stderr)
    finally:
        bench.stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    full = statistics.median(bench._us(g) for g in cells[targets[-1].name])
    print(f"\nnon-stream, c={args.concurrency}, median of {args.rounds} rounds, each server pinned to CPU {pin}\n")
    print("| server | req/s | CPU us/req | share of Turnout's CPU per request |\n|---|---:|---:|---:|")
    for target in targets:
        us = statistics.median(bench._us(g) for g in cells[target.name])
        rps = statistics.median(g["rps"] for g in cells[target.name])
        print(f"| {target.name} | {rps:.0f} | {us:.0f} | {us / full:.0%} |")


if __name__ == "__main__":
    main()
