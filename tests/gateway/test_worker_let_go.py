"""A worker the fleet lets go while a request waits for its view of what is held (a claim's engine unbound as it
sleeps, an endpoint removed) is routed as the request found it: never a KeyError answered as a 500.

CI found it (tests/runtime/test_pool_policy.py, two replicas on Redis waking one claim): a request's view waited on
Redis while the claim's binding went, and ``Fleet.views`` looked the worker up by name."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import EmulatorFactory, GatewayFactory, worker
from turnout.core.admission import Priority
from turnout.gateway.keys import DISPATCHER, FLEET
from turnout.gateway.occupancy import Held

MODEL = "m:1"


@pytest.mark.parametrize("priority", [Priority.STANDARD, Priority.BATCH, Priority.INTERACTIVE])
async def test_a_worker_let_go_during_the_view_is_routed_as_found(
    emulator: EmulatorFactory, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch, priority: Priority
) -> None:
    emus = [await emulator(name, [MODEL]) for name in "ab"]
    gw = await gateway([worker(e.name, e.url, slots=2) for e in emus])
    dispatcher, fleet = gw.app[DISPATCHER], gw.app[FLEET]
    viewed = dispatcher.occupancy.view

    async def view_then_let_go(*args: Any, **kwargs: Any) -> Held:
        held = await viewed(*args, **kwargs)
        fleet.workers.pop("a", None)
        fleet.workers.pop("b", None)
        return held

    monkeypatch.setattr(dispatcher.occupancy, "view", view_then_let_go)
    lease = await dispatcher.acquire(MODEL, priority=priority)
    assert lease.worker.name in {"a", "b"}
    lease.release()
