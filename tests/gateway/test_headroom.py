"""Batch requests hold at most their share of a worker's slots (routing.batch_share), so an interactive or standard
request finds a free slot instead of waiting behind long batch generations; batch waits behind the other classes
in the queue."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, GatewayFactory, create_key, worker
from turnout.core.admission import Priority
from turnout.errors import Unavailable
from turnout.gateway import dispatch
from turnout.gateway.keys import DISPATCHER

MODEL = "m:1"


@pytest.mark.parametrize(("share", "batch_slots"), [(0.5, 2), (0.25, 1), (0.1, 1), (1.0, 4)])
async def test_batch_takes_its_share_of_the_slots(
    emulator: EmulatorFactory, gateway: GatewayFactory, share: float, batch_slots: int
) -> None:
    emu = await emulator("a", [MODEL])
    gw = await gateway(
        [worker("a", emu.url, slots=4, max_concurrent=4)],
        routing={"batch_share": share, "queue_timeout_s": 0.2},
    )
    dispatcher = gw.app[DISPATCHER]
    (await dispatcher.acquire(MODEL)).release()  # other traffic lately: the shares hold (core.headroom)
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(batch_slots)]
    if batch_slots < 4:
        with pytest.raises(Unavailable, match="batch requests hold their share"):
            await dispatcher.acquire(MODEL, priority=Priority.BATCH)
        standard = await dispatcher.acquire(MODEL)  # a standard request still finds a slot
        standard.release()
    for lease in held:
        lease.release()


@pytest.mark.parametrize(("share", "batch_slots"), [(0.5, 1), (0.75, 2), (1.0, 3)])
async def test_batch_takes_its_share_of_the_fleet_of_one_slot_engines(
    emulator: EmulatorFactory, gateway: GatewayFactory, share: float, batch_slots: int
) -> None:
    """Engines that run one request at a time, nothing declared but their one slot: a worker's share is the whole
    engine, so the share holds fleet-wide too, counting the workers that may serve the model (the one that placement
    keeps from it is not counted: 3 slots, not 4), and an interactive request starts at once on a free engine
    instead of waiting in an engine's own queue behind a batch line (bench/batch_fleet.py: every engine ran a batch
    line, interactive time to first token 3.5x)."""
    emus = [await emulator(name, [MODEL]) for name in "abcd"]
    workers = [worker(e.name, e.url, slots=1) for e in emus[:3]]
    workers.append(worker("d", emus[3].url, slots=1, model_placement={"mode": "whitelist", "allowed_models": ["x"]}))
    gw = await gateway(workers, routing={"batch_share": share, "queue_timeout_s": 0.2})
    dispatcher = gw.app[DISPATCHER]
    busy = [await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE) for _ in range(3)]
    for lease in busy:  # interactive traffic lately needed three engines at once: batch keeps to the share
        lease.release()
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(batch_slots)]
    assert len({lease.worker.name for lease in held}) == batch_slots and "d" not in {x.worker.name for x in held}
    if batch_slots < 3:
        with pytest.raises(Unavailable, match=f'batch requests hold their share of the slots of model "{MODEL}"'):
            await dispatcher.acquire(MODEL, priority=Priority.BATCH)
        interactive = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
        assert interactive.worker.name not in {x.worker.name for x in held} | {"d"}  # a free engine, at once
        interactive.release()
    for lease in held:
        lease.release()
    again = await dispatcher.acquire(MODEL, priority=Priority.BATCH)  # given back: room again
    again.release()


async def test_batch_takes_what_the_other_traffic_has_not_needed_lately(
    emulator: EmulatorFactory, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three one-slot engines, share 0.5. Nothing but batch wanted the model over the last QUIET_S: batch takes every
    engine (an idle fleet at night is not a third busy). Interactive traffic that needed one engine at once lately:
    batch holds the other two; that needed all three: one."""
    monkeypatch.setattr(dispatch, "QUIET_S", 0.4)
    emus = [await emulator(name, [MODEL]) for name in "abc"]
    gw = await gateway([worker(e.name, e.url, slots=1) for e in emus], routing={"queue_timeout_s": 0.2})
    dispatcher = gw.app[DISPATCHER]
    night = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(3)]
    assert len({x.worker.name for x in night}) == 3
    for lease in night:
        lease.release()
    day = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)  # the others need one slot at once now
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(2)]
    assert day.worker.name not in {x.worker.name for x in held}
    with pytest.raises(Unavailable, match="is busy"):  # (and none is free: a batch request goes only to a free slot)
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)  # 3 slots, 1 needed by the others: 2 for batch
    for lease in [day, *held]:
        lease.release()
    busy = [await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE) for _ in range(3)]
    for lease in busy:
        lease.release()
    lone = await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    with pytest.raises(Unavailable, match="share of the slots"):  # they needed all three: the share, one
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    lone.release()
    await asyncio.sleep(0.5)  # a quiet window: every engine again
    again = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(3)]
    for lease in again:
        lease.release()


async def test_an_interactive_request_does_not_wait_behind_batch_lines_that_cannot_go(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A batch line waits in the queue (batch holds its share of the fleet); an interactive request that arrives
    finds that waiter ahead of it, joins the queue before it, and goes at once to an idle engine: it waited for a
    slot to be given back, with two engines idle (bench/batch_fleet.py: waited p50 0.25 s)."""
    emus = [await emulator(name, [MODEL]) for name in "abc"]
    gw = await gateway([worker(e.name, e.url, slots=1) for e in emus], routing={"queue_timeout_s": 30})
    dispatcher = gw.app[DISPATCHER]
    busy = [await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE) for _ in range(3)]
    for lease in busy:  # the interactive traffic needed all three lately: batch holds one engine
        lease.release()
    line = await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    waiting = asyncio.create_task(dispatcher.acquire(MODEL, priority=Priority.BATCH))
    for _ in range(100):
        if dispatcher.waiting:
            break
        await asyncio.sleep(0.01)
    assert dispatcher.waiting == 1
    person = await asyncio.wait_for(dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE), 5)
    assert person.worker.name != line.worker.name and not waiting.done()
    person.release()
    line.release()
    (await asyncio.wait_for(waiting, 5)).release()


async def test_a_waiting_interactive_request_goes_before_waiting_batch(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("a", [MODEL])
    gw = await gateway([worker("a", emu.url, max_concurrent=1)], routing={"batch_share": 1.0})
    dispatcher = gw.app[DISPATCHER]
    first = await dispatcher.acquire(MODEL)
    order: list[str] = []

    async def ask(name: str, priority: Priority) -> None:
        lease = await dispatcher.acquire(MODEL, priority=priority)
        order.append(name)
        await asyncio.sleep(0.01)
        lease.release()

    batch = asyncio.create_task(ask("batch", Priority.BATCH))
    await asyncio.sleep(0.05)  # batch waits first
    interactive = asyncio.create_task(ask("interactive", Priority.INTERACTIVE))
    await asyncio.sleep(0.05)
    first.release()
    await asyncio.gather(batch, interactive)
    assert order == ["interactive", "batch"]


async def test_a_batch_request_takes_another_worker_when_the_first_choice_has_no_batch_slot(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Two two-slot workers, batch_share 0.5: one batch slot each. A batch request holds one on the worker that has
    the prompt; the next turn of the same prompt ranks that worker first (its prefix), whose batch slot is taken: it
    goes to the other worker at once instead of waiting for the first one's long answer (bench/batch_fleet.py saw
    batch lines queue behind one engine while two idled)."""
    slow = {"tokens": 40, "token_delay_s": 0.05}
    a, b = await emulator("a", [MODEL], **slow), await emulator("b", [MODEL], **slow)
    gw = await gateway(
        [worker("a", a.url, type="openai", slots=2), worker("b", b.url, type="openai", slots=2)],
        auth={"open": False},
        routing={"batch_share": 0.5, "explain_header": True, "queue_timeout_s": 30},
    )
    _, key = create_key(gw, app="nightly", priority=Priority.BATCH)
    headers = {"Authorization": f"Bearer {key}"}
    (await gw.app[DISPATCHER].acquire(MODEL)).release()  # other traffic lately: the shares hold (core.headroom)
    system = "You summarise documents for the nightly job. " * 40
    turn = [{"role": "system", "content": system}, {"role": "user", "content": "the first document"}]
    async with aiohttp.ClientSession() as http:

        async def ask(messages: list[dict[str, str]]) -> tuple[str, float]:
            started = time.monotonic()
            body = {"model": MODEL, "messages": messages}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
                return r.headers["X-Turnout-Route"], time.monotonic() - started

        first = asyncio.create_task(ask(turn))
        for _ in range(100):  # the first one runs
            if a.active or b.active:
                break
            await asyncio.sleep(0.02)
        holder = "a" if a.active else "b"
        route, took = await ask([*turn, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}])
        first_route, first_took = await first
    assert first_route.startswith(holder)
    assert not route.startswith(holder), route  # the other worker, not a wait for the holder's batch slot
    assert took < first_took + 1.0, (took, first_took)  # its own 2 s, not the holder's answer first (4 s)


@pytest.mark.parametrize("share", [0.5, 1.0])
async def test_a_batch_request_never_waits_in_an_engines_own_queue(
    emulator: EmulatorFactory, gateway: GatewayFactory, share: float
) -> None:
    """Nothing else wanted the model lately, or no headroom at all (share 1): batch takes every slot, and no more.
    A batch request beyond them waits in the gateway's queue (where a later interactive request goes first), not in
    the engine's (bench/batch_fleet.py with batch_share 1: interactive requests waited 1.4 s behind lines queued in
    the engines)."""
    emus = [await emulator(name, [MODEL]) for name in "ab"]
    gw = await gateway(
        [worker(e.name, e.url, slots=1) for e in emus], routing={"batch_share": share, "queue_timeout_s": 0.2}
    )
    dispatcher = gw.app[DISPATCHER]
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(2)]
    assert {lease.worker.name for lease in held} == {"a", "b"}
    with pytest.raises(Unavailable, match="is busy"):
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    interactive = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)  # (it would wait in an engine)
    with pytest.raises(Unavailable, match="is busy"):  # a slot given back goes to no batch request while it is busy
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    for lease in [*held, interactive]:
        lease.release()


async def test_an_aged_batch_request_takes_a_free_slot_and_holds_no_standard_one_back(
    emulator: EmulatorFactory, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch request that has waited the ageing time is served as a standard one: at the head of the queue, no
    batch share holds it back from a free slot (it had kept a later standard request from that slot until a
    running request ended), and it routes again as it ages, with nobody to wake it."""
    from turnout.core import admission

    monkeypatch.setattr(admission, "BATCH_AGEING_S", 0.4)
    emu = await emulator("a", [MODEL])
    gw = await gateway([worker("a", emu.url, slots=2, max_concurrent=2)], routing={"queue_timeout_s": 1.5})
    dispatcher = gw.app[DISPATCHER]
    (await dispatcher.acquire(MODEL)).release()  # other traffic lately: the batch share (one of two) holds
    first = await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    waiting = asyncio.create_task(dispatcher.acquire(MODEL, priority=Priority.BATCH))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # its share is taken
    aged = await asyncio.wait_for(waiting, 2)  # it ages and takes the free slot
    with pytest.raises(Unavailable):  # both slots taken now: a standard request waits its queue_timeout_s
        await dispatcher.acquire(MODEL, priority=Priority.STANDARD)
    first.release()
    standard = await asyncio.wait_for(dispatcher.acquire(MODEL), 2)  # and goes once a slot is free
    for lease in (aged, standard):
        lease.release()


async def test_an_interactive_request_stops_the_line_that_started_last_and_goes_there(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Three one-slot engines, each running a Batch API line (``batch_share`` 1: no headroom). An interactive request
    with no prompt held anywhere is ranked as if only the line whose stop throws the least work away were stopped
    (the one that started last), and goes there: ranked as if every line were stopped, it went wherever routing sends
    it on an idle fleet and stopped the line there, the oldest as often as the newest."""
    emus = [await emulator(name, [MODEL]) for name in "abc"]
    gw = await gateway([worker(e.name, e.url, slots=1) for e in emus], routing={"batch_share": 1})
    dispatcher = gw.app[DISPATCHER]
    for _ in range(2):
        stopped: list[str] = []
        lines = [
            await dispatcher.acquire(MODEL, priority=Priority.BATCH, stop=lambda n=n, s=stopped: s.append(f"line{n}"))
            for n in range(3)
        ]
        assert len({x.worker.name for x in lines}) == 3
        person = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
        assert stopped == ["line2"] and person.worker.name == lines[2].worker.name
        for lease in [person, *lines]:
            lease.release()


@pytest.mark.parametrize(
    ("company", "quiet", "batch_slots"),
    [
        (None, False, 2),  # nothing learned of its sharing: half of its four slots
        ({0: (0.0, 100.0, 5), 1: (1.0, 50.0, 5)}, False, 1),  # time-shared: one at full speed, batch holds that
        ({0: (0.0, 100.0, 5), 3: (3.0, 100.0, 5)}, False, 2),  # batching for free: its slots, as before
        ({0: (0.0, 100.0, 5), 1: (1.0, 50.0, 5)}, True, 4),  # nothing else wanted the model lately: every slot
    ],
)
async def test_batch_headroom_is_counted_at_the_engines_full_speed(
    emulator: EmulatorFactory,
    gateway: GatewayFactory,
    company: dict[int, tuple[float, float, int]] | None,
    quiet: bool,
    batch_slots: int,
) -> None:
    """A four-slot engine whose slots share its speed (CPU threads, turnout.core.sharing): a free slot beside batch
    requests is no headroom for an interactive one, so batch_share 0.5 is half of what it gets through at full
    speed (one request's worth) rather than half of its slots."""
    from turnout.gateway.keys import FLEET

    emu = await emulator("a", [MODEL], num_parallel=4)
    gw = await gateway([worker("a", emu.url, slots=4)], routing={"batch_share": 0.5, "queue_timeout_s": 0.2})
    dispatcher = gw.app[DISPATCHER]
    if company is not None:
        now = time.monotonic()
        figures = gw.app[FLEET].workers["a"].figures(MODEL)
        figures.company = {at: (*level, now) for at, level in company.items()}
    if not quiet:
        (await dispatcher.acquire(MODEL)).release()  # other traffic lately: the shares hold
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(batch_slots)]
    with pytest.raises(Unavailable, match=r"batch requests hold their share|is busy"):
        await dispatcher.acquire(MODEL, priority=Priority.BATCH)
    interactive = await dispatcher.acquire(MODEL, priority=Priority.INTERACTIVE)
    for lease in [*held, interactive]:
        lease.release()
