"""`turnout serve --workers 2`: a request served by either process stops the Batch API line the other runs
(turnout.gateway.supervised: ``occ.offer`` / ``occ.stop``), as one process stops its own. The real command, on the
Ollama stand-in as a one-slot engine whose answers take a second; the process running the batch is the one that
logged it, and the stopped lines are counted by that process (every process's counters come with any scrape)."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path

import aiohttp
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import EmulatorFactory, free_port
from tests.gateway.test_processes import TOKEN, _access, _config, _key, _started, _stop, two_processes

MODEL = "m:1"
RUNNING = re.compile(r"turnout\.batches\[(\d+)\]: running batch ")
SENT = 12  # requests, one after another (8 lines, each stopped at most three times: 24 stops in all)


def _lines(count: int) -> bytes:
    rows = []
    for n in range(count):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"line {n}"}]}
        rows.append({"custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


async def _stopped(url: str) -> dict[str, float]:
    """``turnout_preempted_requests_total`` of each process (its ``process`` label: any process answers with every
    process's, turnout.gateway.process_metrics)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics", headers=headers) as r:
        text = await r.text()
    return {
        sample.labels["process"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "turnout_preempted_requests_total"
    }


async def test_a_request_on_either_process_stops_the_line_the_other_runs(
    emulator: EmulatorFactory, tmp_path: Path
) -> None:
    emu = await emulator("a", [MODEL], tokens=20, token_delay_s=0.05, num_parallel=1)
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url, "slots": 1}], batches={"poll_s": 0.2})
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as oa:
            uploaded = await oa.files.create(file=("b.jsonl", io.BytesIO(_lines(8))), purpose="batch")
            batch = await oa.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )

            running = await asyncio.to_thread(gateway.wait_for, "running batch", 30)
            match = RUNNING.search(running)
            assert match is not None, running
            runs = int(match[1])
            await asyncio.sleep(0.5)  # its first line runs
            headers = {"Authorization": f"Bearer {key}"}
            body = {"model": MODEL, "messages": [{"role": "user", "content": "now"}]}
            for _ in range(SENT):  # each over a new connection: the kernel spreads them over the two processes
                async with (
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=headers) as http,
                    http.post(f"{url}/v1/chat/completions", json=body) as r,
                ):
                    assert r.status == 200, await r.text()
                await asyncio.sleep(0.3)  # the stopped line takes the slot back
            # every request found a line running and stopped it, whichever process served it; the process running
            # the line counted every stop
            assert sorted((await _stopped(url)).values()) == [0, SENT]
            done = await oa.batches.retrieve(batch.id)
            while done.status not in ("completed", "failed", "expired", "cancelled"):
                await asyncio.sleep(0.3)
                done = await oa.batches.retrieve(batch.id)
            assert done.status == "completed" and done.request_counts is not None
            assert done.request_counts.completed == 8
        assert await _stop(gateway) == 0
    served = {pid for pid, _ in _access(gateway.lines, "/v1/chat/completions")}
    assert runs in served and len(served) == 2  # both processes served requests (1 in 2**11 that one did all)
