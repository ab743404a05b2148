"""`turnout serve --workers 2`: `/metrics` and the Overview count every process's requests, whichever process a
scrape reaches (turnout.gateway.process_metrics). Before, each read the one process the kernel handed the
connection to: a counter jumped between the processes' counts from one scrape to the next."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import EmulatorFactory, free_port
from tests.gateway.test_processes import (
    CHAT,
    TOKEN,
    _children,
    _config,
    _fresh,
    _key,
    _pids,
    _started,
    two_processes,
)

MODEL = "qwen3:8b"


async def _scrape(url: str) -> tuple[int, str]:
    """One scrape over a fresh connection: the pid that answered (/healthz on the same connection) and the text."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        async with http.get(f"{url}/healthz") as r:
            pid = (await r.json())["pid"]
        async with http.get(f"{url}/metrics", headers=headers) as r:
            assert r.status == 200
            return pid, await r.text()


def _requests(text: str) -> dict[str, float]:
    """``turnout_requests_total`` of the chat route, per process label."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "turnout_requests_total" and sample.labels.get("endpoint") == "/v1/chat/completions":
                process = sample.labels["process"]
                out[process] = out.get(process, 0) + sample.value
    return out


async def _one_worker(emulator: EmulatorFactory, tmp_path: Path, **pace: Any) -> tuple[Path, str, int, str]:
    """The config of a gateway with one worker, the Ollama stand-in "a" serving MODEL (``pace``: how it answers), a
    key, the port to serve on and its URL."""
    emu = await emulator("a", [MODEL], **pace)
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}])
    port = free_port()
    return config, _key(tmp_path), port, f"http://127.0.0.1:{port}"


async def test_every_scrape_counts_both_processes_requests(emulator: EmulatorFactory, tmp_path: Path) -> None:
    config, key, port, url = await _one_worker(emulator, tmp_path)
    with two_processes(config, port) as gateway:
        await _started(gateway)
        pids = await _pids(url)
        assert len(pids) == 2
        statuses = [(await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT))[0] for _ in range(12)]
        assert statuses == [200] * 12
        answered: set[int] = set()
        for _ in range(60):  # until both processes have answered a scrape
            pid, text = await _scrape(url)
            answered.add(pid)
            counts = _requests(text)
            assert set(counts) == {"1", "2"} and sum(counts.values()) == 12, counts
            assert "did not answer" not in text
            if len(answered) == 2:
                break
        assert answered == pids

        # a process killed: every scrape still answers, with the survivor's counts (the other's died with it), and
        # says which process did not answer while it restarts
        before = set(counts.values())
        os.kill(_children(gateway.proc.pid)[0], signal.SIGKILL)
        for _ in range(6):
            _, text = await _scrape(url)
            assert sum(_requests(text).values()) in before, (before, _requests(text))


async def _overview_pages(url: str, count: int) -> list[str]:
    """The Overview's body ``count`` times, each over a fresh connection (both processes answer some), signed in."""
    pages = []
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), cookie_jar=jar) as ui:
        async with ui.get(f"{url}/admin") as r:
            csrf = r.cookies["turnout_signin"].value
        form = {"csrf_token": csrf, "token": TOKEN, "next": "/admin"}
        async with ui.post(f"{url}/admin/signin", data=form, allow_redirects=False) as r:
            assert r.status == 303, r.status
        for _ in range(count):
            async with ui.get(f"{url}/admin/overview/fragment") as r:
                assert r.status == 200
                pages.append(await r.text())
    return pages


async def test_where_the_time_went_counts_both_processes_requests(emulator: EmulatorFactory, tmp_path: Path) -> None:
    config, key, port, url = await _one_worker(emulator, tmp_path)
    answered = re.compile(r'<tr data-phase="total_whole">.*?<td data-count>(\d+)</td>', re.S)
    with two_processes(config, port) as gateway:
        await _started(gateway)
        for _ in range(3):  # until each process has answered some of them (the kernel picks, per connection)
            statuses = [(await _fresh("POST", f"{url}/v1/chat/completions", key, CHAT))[0] for _ in range(12)]
            assert statuses == [200] * 12
            _, text = await _scrape(url)
            per_process = _requests(text)
            if len(per_process) == 2 and all(per_process.values()):
                break
        assert len(per_process) == 2 and all(per_process.values()), per_process
        total = int(sum(per_process.values()))
        for page in await _overview_pages(url, 6):
            assert (m := answered.search(page)) is not None and int(m[1]) == total, (total, page[:2000])


async def test_the_overview_counts_a_request_running_on_either_process(
    emulator: EmulatorFactory, tmp_path: Path
) -> None:
    config, key, port, url = await _one_worker(emulator, tmp_path, tokens=200, token_delay_s=0.05)
    running = re.compile(r'<tr data-class="standard">.*?<td data-running>(\d+)</td>', re.S)
    in_flight = re.compile(r'data-stat="in-flight">(\d+)<')
    with two_processes(config, port) as gateway:
        await _started(gateway)
        body = {**CHAT, "stream": True}
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=headers) as http,
            http.post(f"{url}/v1/chat/completions", json=body) as stream,
        ):
            assert stream.status == 200
            await stream.content.readline()  # it runs now
            pages = await _overview_pages(url, 8)
            for page in pages:
                assert (m := running.search(page)) is not None and m[1] == "1", page[:2000]
                assert (m := in_flight.search(page)) is not None and m[1] == "1"
