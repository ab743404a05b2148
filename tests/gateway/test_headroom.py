"""Batch requests hold at most their share of a worker's slots (routing.batch_share), so an interactive or standard
request finds a free slot instead of waiting behind long batch generations; batch waits behind the other classes
in the queue."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import EmulatorFactory, GatewayFactory, worker
from turnout.core.admission import Priority
from turnout.errors import Unavailable
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
    held = [await dispatcher.acquire(MODEL, priority=Priority.BATCH) for _ in range(batch_slots)]
    if batch_slots < 4:
        with pytest.raises(Unavailable, match="batch requests hold their share"):
            await dispatcher.acquire(MODEL, priority=Priority.BATCH)
        standard = await dispatcher.acquire(MODEL)  # a standard request still finds a slot
        standard.release()
    for lease in held:
        lease.release()


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
