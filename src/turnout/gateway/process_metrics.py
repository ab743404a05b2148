"""`/metrics` of `turnout serve --workers N`: every process's metrics, whichever process the scrape reaches.

Each process counts its own requests (prometheus_client's registry is per process), and the kernel hands a scrape's
connection to any one of them, so before this a scrape read one process's counters at random: a rate over them
jumped between processes. Now each process also answers ``/metrics`` on a private Unix socket (in a 0700 directory
the supervisor made, ``metrics-<process>.sock``; and ``/phases?minutes=N``, its counts behind the Overview's "where
the time went": :func:`every_process_phases`), and the process a scrape reaches reads the others' there and
answers with every process's samples, each labelled ``process="<n>"`` (1 to N: stable across a process's restart,
so the series stay few), as Prometheus labels each replica's with ``instance``. ``sum by (...)`` adds them up. A
process that does not answer within :data:`PEER_TIMEOUT_S` (restarting) is left out and named in a comment line.

The merge parses each text with prometheus_client's own parser and writes it with its own writer, so the output is
the exposition format prometheus_client writes for one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from turnout.gateway.keys import METRICS
from turnout.phase_stats import Recent

__all__ = [
    "PROCESS_GROUP",
    "ProcessGroup",
    "attach",
    "every_process",
    "every_process_families",
    "every_process_phases",
]

PEER_TIMEOUT_S = 2.0
LABEL = "process"
_SITE: web.AppKey[web.AppRunner] = web.AppKey("process_metrics_site")


@dataclass(frozen=True)
class ProcessGroup:
    """Where the processes of one `serve --workers N` answer for their metrics, and which one this is (0-based)."""

    run_dir: Path
    index: int
    count: int

    def socket(self, index: int) -> Path:
        return self.run_dir / f"metrics-{index + 1}.sock"


# Where this process and its siblings answer for their metrics; absent where one process serves alone.
PROCESS_GROUP: web.AppKey[ProcessGroup] = web.AppKey("process_group")


def attach(app: web.Application, group: ProcessGroup) -> None:
    """Serve this process's own metrics on its socket while ``app`` runs (before ``app`` is started)."""
    app[PROCESS_GROUP] = group
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)


async def _start(app: web.Application) -> None:
    metrics = app[METRICS]

    async def own(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain")

    async def phases(request: web.Request) -> web.Response:
        asked = request.query.get("minutes", "")
        if not asked.isdigit():
            raise web.HTTPBadRequest(text="minutes: a whole number")
        minutes = int(asked)
        recent = metrics.phases.recent_counts(minutes, time.perf_counter())
        return web.json_response([[n, list(fine.items())] for n, fine in recent])

    inner = web.Application()
    inner.router.add_get("/metrics", own)
    inner.router.add_get("/phases", phases)
    runner = web.AppRunner(inner, access_log=None)
    await runner.setup()
    group = app[PROCESS_GROUP]
    path = group.socket(group.index)
    path.unlink(missing_ok=True)  # left by this process's predecessor, which crashed
    await web.UnixSite(runner, str(path)).start()
    app[_SITE] = runner


async def _stop(app: web.Application) -> None:
    runner = app.get(_SITE)
    if runner is not None:
        await runner.cleanup()


async def _peer(path: Path, what: str) -> str | None:
    """What the process answering on ``path`` says at ``/<what>``, or None (not started yet, restarting, too
    slow)."""
    timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path)), timeout=timeout) as http,
            http.get(f"http://process/{what}") as reply,
        ):
            return await reply.text() if reply.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def _others(group: ProcessGroup, what: str) -> dict[int, str]:
    """What each other process of the group answers at ``/<what>``, by its index (0-based), asked at once; those
    that do not answer left out."""
    others = [i for i in range(group.count) if i != group.index]
    texts = await asyncio.gather(*(_peer(group.socket(i), what) for i in others))
    return {i: text for i, text in zip(others, texts, strict=True) if text is not None}


async def every_process_phases(app: web.Application, minutes: int) -> list[Recent]:
    """Each answering process's phase counts of the last ``minutes`` (:meth:`PhaseStats.recent_counts`), for the
    Overview's "where the time went" over all of them (:func:`turnout.phase_stats.summarize`); this process's own
    alone where it serves alone."""
    own = app[METRICS].phases.recent_counts(minutes, time.perf_counter())
    group = app.get(PROCESS_GROUP)
    if group is None:
        return [own]
    out = [own]
    for text in (await _others(group, f"phases?minutes={minutes}")).values():
        out.append([(int(n), {int(b): int(k) for b, k in fine}) for n, fine in json.loads(text)])
    return out


async def every_process_families(app: web.Application) -> dict[int, list[Metric]]:
    """Each answering process's metric families by its number (1-based), in an app of a group (:func:`attach`)."""
    group = app[PROCESS_GROUP]
    texts = await _others(group, "metrics")
    texts[group.index] = app[METRICS].render().decode()
    out: dict[int, list[Metric]] = {}
    for index in sorted(texts):
        with contextlib.suppress(ValueError):  # (a process's own writer's text: never expected to fail)
            out[index + 1] = list(text_string_to_metric_families(texts[index]))
    return out


async def every_process(app: web.Application) -> bytes:
    """The ``/metrics`` body: this process's own, or with a group every answering process's, labelled."""
    group = app.get(PROCESS_GROUP)
    if group is None:
        return app[METRICS].render()
    families = await every_process_families(app)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))
    body = generate_latest(registry)
    missing = [str(n) for n in range(1, group.count + 1) if n not in families]
    if missing:
        body += f"# turnout: process {', '.join(missing)} did not answer (starting or restarting)\n".encode()
    return body


class _Merged:
    """Every process's families, one family per name, each sample labelled with its process."""

    def __init__(self, families: Mapping[int, list[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for number, families in self.families.items():
            process = str(number)
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(s._replace(labels={**s.labels, LABEL: process}) for s in family.samples)
        yield from merged.values()
