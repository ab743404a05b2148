"""A running batch request is stopped for an interactive or standard request that finds every slot taken
(turnout.core.preemption, turnout.gateway.preemption): the dispatcher's rule, and the Batch API end to end on the
Ollama emulator (a one-slot engine whose answers take seconds). The same on llama.cpp's own server, where a line
is sent as a stream so that its slot is free at once: tests/gateway/test_batches.py."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, create_key, eventually, worker
from tests.gateway.test_batches import FAST, finished, jsonl, lines_of
from tests.gateway.test_usage_accounting import usage_rows
from turnout.core.admission import Priority
from turnout.core.preemption import STOPS_MOST
from turnout.errors import Unavailable
from turnout.gateway.keys import DISPATCHER

MODEL = "m:1"


class Stops:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def to(self, name: str) -> Any:
        return lambda: self.calls.append(name)


async def test_a_waiting_interactive_request_stops_the_batch_request_that_started_last(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Workers capped at one request each (max_concurrent), both running batch requests: an interactive request
    waits in the gateway's queue, stops the one that started last, and takes its slot when it ends."""
    emus = [await emulator(name, [MODEL]) for name in "ab"]
    gw = await gateway([worker(e.name, e.url, max_concurrent=1) for e in emus], routing={"queue_timeout_s": 10})
    dispatcher = gw.app[DISPATCHER]
    stops = Stops()
    first = await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("first"))  # (nothing else lately)
    second = await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("second"))
    waiting = asyncio.create_task(dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE))
    await eventually(lambda: _true(stops.calls), "a batch request to be stopped", 5)
    assert stops.calls == ["second"] and not waiting.done()  # the one that started last; stopped, not yet ended
    second.release()  # its request ends: the slot goes to the waiter
    lease = await asyncio.wait_for(waiting, 5)
    assert lease.worker.name == second.worker.name
    assert stops.calls == ["second"]  # one stop per waiting request
    for held in (first, lease):
        held.release()
    assert "turnout_preempted_requests_total 1.0" in await _metrics(gw)


@pytest.mark.parametrize("workers", [1, 3])
async def test_on_engines_that_run_one_at_a_time_the_request_goes_where_it_stops_a_batch_request(
    emulator: EmulatorFactory, gateway: GatewayFactory, workers: int
) -> None:
    """Nothing capped (the default): a request is sent at once and would wait in the engine's own queue. Every
    engine (one slot each) runs a batch request: the interactive request is ranked as if they were stopped, goes to
    one, and stops the batch request there (and no other)."""
    emus = [await emulator(name, [MODEL]) for name in "abc"[:workers]]
    gw = await gateway([worker(e.name, e.url, slots=1) for e in emus])
    dispatcher = gw.app[DISPATCHER]
    stops = Stops()
    batch = [await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=stops.to(str(n))) for n in range(workers)]
    assert len({lease.worker.name for lease in batch}) == workers
    lease = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
    stopped = [n for n, held in enumerate(batch) if held.worker.name == lease.worker.name]
    assert stops.calls == [str(stopped[0])]
    standard = await dispatcher.acquire(MODEL)  # a standard request stops one too, on another engine
    if workers == 1:  # the one line was stopped already: nothing left to stop (it waits in the engine's queue)
        assert len(stops.calls) == 1
    else:
        assert len(stops.calls) == 2 and standard.worker.name != lease.worker.name
    for held in (*batch, lease, standard):
        held.release()


async def test_nothing_is_stopped_while_an_engine_is_free(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Three one-slot engines, one running a batch request: interactive requests go to the free ones; only when
    every engine runs something does one stop the batch request."""
    emus = [await emulator(name, [MODEL]) for name in "abc"]
    gw = await gateway([worker(e.name, e.url, slots=1) for e in emus])
    dispatcher = gw.app[DISPATCHER]
    stops = Stops()
    line = await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("line"))
    people = [await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE) for _ in range(2)]
    assert stops.calls == [] and line.worker.name not in {p.worker.name for p in people}
    third = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
    assert stops.calls == ["line"] and third.worker.name == line.worker.name
    for held in (line, *people, third):
        held.release()


async def _true(value: Any) -> Any:
    return value or None


async def test_batch_requests_without_a_stop_and_waits_for_other_reasons_stop_nothing(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A batch request that may not be stopped (a line stopped once already) is left running; a batch request that
    waits stops nothing; a request that waits for its tenant's cap stops nothing (it would not start)."""
    emu = await emulator("a", [MODEL])
    gw = await gateway(
        [worker("a", emu.url, max_concurrent=1)],
        routing={"queue_timeout_s": 0.3},
        tenants={"t": {"max_concurrent": 1}},
    )
    dispatcher = gw.app[DISPATCHER]
    stops = Stops()
    running = await dispatcher.acquire(MODEL, priority=Priority.BATCH)  # no stop
    with pytest.raises(Unavailable):
        await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
    running.release()
    line = await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("line"))
    with pytest.raises(Unavailable):
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    assert stops.calls == []
    line.release()
    tenant = await dispatcher.acquire(MODEL, tenant="t", priority=Priority.INTERACTIVE)
    tenant.release()
    emu2 = await emulator("b", [MODEL])
    gw2 = await gateway(
        [worker("a", emu.url), worker("b", emu2.url)],
        routing={"queue_timeout_s": 0.3},
        tenants={"t": {"max_concurrent": 1}},
    )
    d2 = gw2.app[DISPATCHER]
    mine = await d2.acquire(MODEL, tenant="t", priority=Priority.INTERACTIVE)
    batch = await d2.acquire(MODEL, priority=Priority.BATCH, stop=stops.to("batch"))
    with pytest.raises(Unavailable, match='tenant "t" is at its limit'):
        await d2.acquire(MODEL, tenant="t", priority=Priority.INTERACTIVE)
    assert stops.calls == []
    for held in (mine, batch):
        held.release()


async def _metrics(gw: Gateway) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics", headers=gw.admin_headers) as r:
        return await r.text()


def _line(n: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"line {n}"}]}
    return {"custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}


async def test_a_batch_line_is_stopped_at_most_three_times_for_interactive_requests_and_answered_once(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """One engine that runs one request at a time, each answer 2 s long; a batch of one line. An interactive
    request sent while the line runs is answered before the line (without the stop it would wait for the line); the
    line is sent again, and the next interactive request stops it again, up to STOPS_MOST times (no usage row, no
    error for a stopped attempt). The request after that does not stop it (the bound on the work thrown away): it is
    answered after the line, which is answered once."""
    emu = await emulator("a", [MODEL], tokens=20, token_delay_s=0.1, num_parallel=1)
    gw = await gateway([worker("a", emu.url, slots=1)], auth={"open": False}, batches=FAST)
    _, nightly = create_key(gw, app="nightly", priority=Priority.BATCH)
    _, chat = create_key(gw, app="chat", priority=Priority.INTERACTIVE)
    dispatcher = gw.app[DISPATCHER]
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=nightly, max_retries=0) as oa:
        uploaded = await oa.files.create(file=("b.jsonl", io.BytesIO(jsonl([_line(1)]))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=chat, max_retries=0) as person:
            asked = {"model": MODEL, "messages": [{"role": "user", "content": "now"}]}
            for _ in range(STOPS_MOST):
                await eventually(lambda: _true(dispatcher._stoppable), "the line to run (stoppable)", 10)
                answer = await person.chat.completions.create(**asked)  # type: ignore[call-overload]
                assert answer.choices[0].message.content
                # answered before the line (without the stop it would have waited for the line's 2 s in the engine)
                assert (await oa.batches.retrieve(batch.id)).request_counts.completed == 0  # type: ignore[union-attr]
            await eventually(lambda: _true(dispatcher.occupancy.workers.get("a")), "the line to run again", 10)  # type: ignore[attr-defined]
            assert not dispatcher._stoppable  # it runs again, and may not be stopped now
            last = await person.chat.completions.create(**asked)  # type: ignore[call-overload]
            assert last.choices[0].message.content
            # it could not stop the line again: answered after it
            assert (await oa.batches.retrieve(batch.id)).request_counts.completed == 1  # type: ignore[union-attr]
        done = await finished(oa, batch.id, 60)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 1 and done.request_counts.failed == 0
        output = await lines_of(oa, done.output_file_id)
        assert [o["custom_id"] for o in output] == ["l1"] and output[0]["response"]["status_code"] == 200
    rows = await usage_rows(gw)
    batch_rows = await usage_rows(gw, batch=batch.id)  # the stopped attempt left none: one row, the line's answer
    assert sum(r["requests"] for r in batch_rows) == 1 and sum(r["requests"] for r in rows) == 2 + STOPS_MOST
    assert not any(r["errors"] for r in rows)
    assert f"turnout_preempted_requests_total {STOPS_MOST:.1f}" in await _metrics(gw)
