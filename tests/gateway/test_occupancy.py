"""The occupancy's keepers follow one set of rules (turnout.core.admission, turnout.core.prefix.match_of): the same
tables run against the memory keeper, the supervisor's (``serve --workers N``: asked over its wire format) and Redis
(a real redis-server), then what only Redis does: leases that
expire with their replica, a waiter on one replica woken by a slot given back on another, and Redis going away and
coming back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest

from tests.support.services import redis_server
from turnout.core.admission import Caps, Priority
from turnout.core.prefix import PrefixIndex, prompt_of
from turnout.gateway import redis_occupancy
from turnout.gateway.occupancy import Grant, LocalOccupancy, Occupancy, Ticket, next_id
from turnout.gateway.redis_occupancy import RedisOccupancy
from turnout.gateway.supervised import OccupancyKeeper, SupervisedOccupancy

TENANT_CAPS = {"capped": 1}
NO_CAPS = Caps()


def indexes() -> Callable[[str], PrefixIndex | None]:
    made: dict[str, PrefixIndex] = {}
    return lambda worker: made.setdefault(worker, PrefixIndex(1000, 100))


class Wires:
    """Processes' channels to one supervisor's keeper, in one event loop: each message as the wire carries it, and
    what the keeper tells a process unasked (``occ.wake``, ``occ.stop``) handed to it."""

    def __init__(self) -> None:
        self.keeper = OccupancyKeeper(self._to_process, tenant_caps=TENANT_CAPS, blocks=1000, ttl_s=600)
        self.processes: dict[int, SupervisedOccupancy] = {}

    def _to_process(self, fd: int, message: list[Any]) -> None:
        self.processes[fd].told(orjson.loads(orjson.dumps(message)))

    def process(self, fd: int) -> SupervisedOccupancy:
        """A process on channel ``fd``."""
        made = self.processes[fd] = SupervisedOccupancy(_Channel(self.keeper, fd))  # type: ignore[arg-type]
        return made


class _Channel:
    def __init__(self, keeper: OccupancyKeeper, fd: int) -> None:
        self.keeper, self.fd, self.n = keeper, fd, 0

    async def ask(self, op: str, *fields: Any) -> list[Any]:
        self.n += 1
        answer = self.keeper.apply(self.fd, orjson.loads(orjson.dumps([self.n, op, *fields])))
        assert answer is not None
        return orjson.loads(orjson.dumps(answer))  # type: ignore[no-any-return]

    def tell(self, op: str, *fields: Any) -> None:
        self.keeper.apply(self.fd, orjson.loads(orjson.dumps([0, op, *fields])))


@pytest.fixture(params=["local", "supervised", "redis"])
async def keeper(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Occupancy]:
    if request.param == "local":
        yield LocalOccupancy(indexes(), clock=time.monotonic, tenant_caps=TENANT_CAPS)
        return
    if request.param == "supervised":
        yield Wires().process(7)
        return
    occupancy = redis_keeper(redis_url)
    await occupancy.start()
    assert occupancy.up
    yield occupancy
    await occupancy.close()


def redis_keeper(url: str, prefix: str | None = None, **extra: Any) -> RedisOccupancy:
    return RedisOccupancy(
        url,
        prefix=prefix or f"t{uuid.uuid4().hex[:8]}",
        timeout_s=0.5,
        index=indexes(),
        tenant_caps=TENANT_CAPS,
        max_blocks=1000,
        max_sessions=100,
        prefix_ttl_s=600,
        **extra,
    )


def grant(
    worker: str = "w1",
    model: str = "m",
    tenant: str = "",
    caps: Caps = NO_CAPS,
    priority: Priority = Priority.STANDARD,
    ticket: Ticket | None = None,
    prompt: Any = None,
    work: float | None = None,
    seen: int | None = None,
) -> Grant:
    return Grant(next_id("l"), worker, model, tenant, priority, caps, prompt, ticket, work, seen)


@pytest.mark.parametrize(
    ("caps", "held", "refused"),
    [
        (Caps(total=2), [grant("w1"), grant("w2", model="other")], "total"),
        (Caps(model=1), [grant("w2")], "model"),
        (Caps(tenant=1), [grant("w2", model="other", tenant="a")], "tenant"),
        (Caps(worker=1), [grant("w1", model="other")], "worker"),
        (Caps(worker=2), [grant("w1"), grant("w2")], None),
    ],
)
async def test_caps(keeper: Occupancy, caps: Caps, held: list[Grant], refused: str | None) -> None:
    for g in held:
        assert await keeper.take(g) is None
    asked = grant("w1", tenant="a", caps=caps)
    assert await keeper.take(asked) == refused
    if refused is not None:
        keeper.give(held[-1])
        await settle(keeper)
        assert await keeper.take(asked) is None


async def test_a_worker_that_took_requests_since_the_view_is_refused_as_moved(keeper: Occupancy) -> None:
    """A decision is taken only on the counts it was made on: a worker with more requests in flight than its router
    saw (another replica's take landed first) refuses with ``moved``, so the request is routed again; fewer, the same,
    or nothing to check (one candidate) take it."""
    seen = (await keeper.view("m", "", ["w1", "w2"], None, None, {})).workers
    assert seen == {"w1": 0, "w2": 0}
    other = grant("w1")
    assert await keeper.take(other) is None  # another request's take lands between this one's view and take
    assert await keeper.take(grant("w1", seen=seen["w1"])) == "moved"
    assert await keeper.take(grant("w1", seen=seen["w1"], caps=Caps(worker=1))) == "moved"  # before any cap
    assert await keeper.take(grant("w2", seen=seen["w2"])) is None
    assert await keeper.take(grant("w1", seen=1)) is None  # the counts it saw still hold
    keeper.give(other)
    await settle(keeper)
    assert await keeper.take(grant("w1", seen=2)) is None  # one fewer than it saw: taken
    assert await keeper.take(grant("w1")) is None  # nothing to check


async def test_of_two_takes_made_on_one_view_the_second_is_moved(keeper: Occupancy) -> None:
    """Two requests routed on the same counts at the same moment (in Redis, taken in one script): the first is
    taken, the second routes again."""
    first, second = grant("w1", seen=0), grant("w1", seen=0)
    assert await asyncio.gather(keeper.take(first), keeper.take(second)) == [None, "moved"]


async def test_batch_takes_at_most_its_share_of_a_worker(keeper: Occupancy) -> None:
    caps = Caps(worker=4, worker_batch=2)
    batch = [grant(caps=caps, priority=Priority.BATCH) for _ in range(3)]
    assert [await keeper.take(g) for g in batch] == [None, None, "worker_batch"]
    assert await keeper.take(grant(caps=caps)) is None  # an interactive or standard one still finds a slot


async def test_batch_takes_at_most_its_share_of_the_models_workers(keeper: Occupancy) -> None:
    """The model's batch requests on every worker together (one-slot engines: a worker's share is all of it)."""
    caps = Caps(worker_batch=1, model_batch=2)
    batch = [grant(w, caps=caps, priority=Priority.BATCH) for w in ("w1", "w2", "w3")]
    assert [await keeper.take(g) for g in batch] == [None, None, "model_batch"]
    assert await keeper.take(grant("w4", model="other", caps=caps, priority=Priority.BATCH)) is None  # its own
    assert await keeper.take(grant("w3", caps=caps)) is None  # a standard one finds the free engine
    keeper.give(batch[0])
    await settle(keeper)
    assert await keeper.take(batch[2]) is None


async def settle(keeper: Occupancy) -> None:
    """What Redis is sent off the request's path (a give) has arrived."""
    if isinstance(keeper, RedisOccupancy):
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not keeper._background and not keeper._giving:
                return


async def test_a_newcomer_does_not_overtake_a_waiter(keeper: Occupancy) -> None:
    ticket = await keeper.join("m", "a", 1, Priority.STANDARD, 100)
    assert ticket is not None
    assert await keeper.take(grant()) == "ahead"
    held = await keeper.view("m", "", ["w1"], None, None, {})
    assert held.ahead
    assert not (await keeper.view("m", "a", ["w1"], None, ticket, {})).ahead
    assert await keeper.take(grant(ticket=ticket)) is None
    assert await keeper.take(grant()) is None  # the queue is empty again


async def test_weighted_fair_order(keeper: Occupancy) -> None:
    """Two tenants keep requests waiting, weights 3 and 1: three of one per one of the other; within a tenant, in
    the order they came."""
    weights = {"a": 3, "b": 1}
    tickets = []
    for _ in range(8):
        for tenant in ("a", "b"):
            ticket = await keeper.join("m", tenant, weights[tenant], Priority.STANDARD, 100)
            assert ticket is not None
            tickets.append(ticket)
    served = []
    while tickets:
        for ticket in reversed(tickets):  # the latest first: every one but the first of the queue is refused
            refused = await keeper.take(grant(tenant=ticket.tenant, ticket=ticket))
            if refused is None:
                break
            assert refused == "ahead"
        served.append(ticket)
        tickets.remove(ticket)
    order = "".join(t.tenant for t in served)
    assert order[:8].count("a") == 6, order
    firsts = [t for t in served if t.tenant == "a"]
    assert firsts == sorted(firsts, key=lambda t: t.tag)


async def test_classes_go_in_order(keeper: Occupancy) -> None:
    batch = await keeper.join("m", "a", 1, Priority.BATCH, 100)
    standard = await keeper.join("m", "a", 1, Priority.STANDARD, 100)
    interactive = await keeper.join("m", "b", 1, Priority.INTERACTIVE, 100)
    assert batch is not None and standard is not None and interactive is not None
    order = []
    for _ in range(3):
        for ticket in (batch, standard, interactive):
            if ticket not in order and await keeper.take(grant(tenant=ticket.tenant, ticket=ticket)) is None:
                order.append(ticket)
                break
    assert order == [interactive, standard, batch]


async def test_a_tenant_at_its_cap_lets_the_next_go(keeper: Occupancy) -> None:
    assert await keeper.take(grant(tenant="capped")) is None
    first = await keeper.join("m", "capped", 1, Priority.STANDARD, 100)
    second = await keeper.join("m", "free", 1, Priority.STANDARD, 100)
    assert first is not None and second is not None
    assert await keeper.take(grant(tenant="free", ticket=second)) is None


async def test_the_queue_has_a_bound(keeper: Occupancy) -> None:
    assert await keeper.join("m", "a", 1, Priority.STANDARD, 2) is not None
    assert await keeper.join("other", "a", 1, Priority.STANDARD, 2) is not None
    assert await keeper.join("m", "b", 1, Priority.STANDARD, 2) is None  # every model's waiters count


async def test_what_a_worker_holds(keeper: Occupancy) -> None:
    """The prefix index: what was taken with a prompt is held by that worker, as the memory index says it."""
    system = "You are a helpful assistant. " * 40
    first = prompt_of([system, "question one"], 256, "m", "s1")
    later = prompt_of([system, "question one", "answer", "question two"], 256, "m", "s1")
    other = prompt_of(["something else entirely " * 40], 256, "m")
    assert await keeper.take(grant("w1", prompt=first)) is None
    assert await keeper.take(grant("w2", prompt=other)) is None
    held = await keeper.view("m", "", ["w1", "w2"], later, None, {"w1": 1, "w2": None})
    expected = PrefixIndex(1000, 100)
    expected.record(first, 0.0)
    want = expected.match(later, 0.0, 600, 1)
    got = held.matches["w1"]
    assert (got.prefix, got.session, got.history) == (want.prefix, want.session, want.history)
    assert got.prefix > 1000 and got.session == first.size
    assert held.matches["w2"].prefix == 0
    assert held.workers == {"w1": 1, "w2": 1}


async def test_what_a_workers_requests_in_flight_are_expected_to_take(keeper: Occupancy) -> None:
    """Every process and replica prices a worker's queue alike: the work of its requests in flight, each as expected
    where it was ranked (a single candidate's is counted, not ranked), and how long the oldest has run."""
    ranked, single = grant("w1", work=2.5), grant("w1")
    assert await keeper.take(single) is None
    assert await keeper.take(ranked) is None
    await asyncio.sleep(0.1)
    held = await keeper.view("m", "", ["w1", "w2"], None, None, {})
    assert held.backlogs["w1"][:2] == (2.5, 1) and 0.05 <= held.backlogs["w1"].busy_s < 5
    assert held.backlogs["w2"] == (0.0, 0, 0.0)
    keeper.give(single)
    keeper.give(ranked)
    await keeper.settle()
    assert (await keeper.view("m", "", ["w1"], None, None, {})).backlogs["w1"] == (0.0, 0, 0.0)


# -- what only Redis does -----------------------------------------------------------------------------------------
async def test_leases_go_with_their_replica(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that stops renewing (killed) gives its slots back a lease's time later, by Redis's clock."""
    monkeypatch.setattr(redis_occupancy, "LEASE_S", 0.4)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    dead, alive = redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix)
    assert await dead.take(grant(caps=Caps(worker=1))) is None  # never started: nothing renews it
    await alive.start()
    try:
        assert await alive.take(grant(caps=Caps(worker=1))) == "worker"
        await asyncio.sleep(0.5)
        assert await alive.take(grant(caps=Caps(worker=1))) is None
    finally:
        await alive.close()
        await dead.close()


async def test_a_slot_given_back_on_one_replica_wakes_a_waiter_on_another(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken by the other replica's publish: the recheck that would also wake it is put 60 s off, so no timing is
    judged (a 0.5 s bound failed once on this busy 2-core machine)."""
    monkeypatch.setattr(redis_occupancy, "RECHECK_S", 60.0)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a, b = redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix)
    await a.start()
    await b.start()
    try:
        held = grant(caps=Caps(worker=1))
        assert await a.take(held) is None
        ticket = await b.join("m", "", 1, Priority.STANDARD, 100)
        assert ticket is not None
        await asyncio.sleep(0.2)  # b is subscribed
        waiting = asyncio.ensure_future(b.wait(ticket, 60.0))
        a.give(held)
        await asyncio.wait_for(waiting, 20.0)  # woken by the publish (nothing else comes within 60 s)
        assert await b.take(grant(caps=Caps(worker=1), ticket=ticket)) is None
    finally:
        await a.close()
        await b.close()


async def test_every_replica_prices_a_workers_queue_alike(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker's requests in flight are expected to take reaches every replica: the work each was expected to
    be where its replica ranked it, and how long the oldest has run (one replica priced another's request as a whole
    cold one, just sent, and sent the next turn of a conversation away from the worker holding its prefix:
    bench/prefix.py --replicas 3). A lease gone with its replica, given back, or lost with Redis's data is priced as
    it is counted."""
    monkeypatch.setattr(redis_occupancy, "LEASE_S", 0.6)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a, b, dead = redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix), redis_keeper(redis_url, prefix)
    await a.start()
    await b.start()
    try:
        ranked, single = grant("w1", work=2.5), grant("w1")
        assert await a.take(ranked) is None
        assert await a.take(single) is None  # a single candidate's: counted, not ranked
        assert await dead.take(grant("w1", work=9.0)) is None  # its replica never renews it
        await asyncio.sleep(0.2)
        held = await b.view("m", "", ["w1", "w2"], None, None, {})
        assert held.workers == {"w1": 3, "w2": 0}
        w1 = held.backlogs["w1"]
        assert (w1.work_s, w1.ranked) == (11.5, 2) and 0.15 <= w1.busy_s < 5
        assert held.backlogs["w2"] == (0.0, 0, 0.0)
        await asyncio.sleep(0.6)  # the dead replica's lease expires; a renews its own
        await a._renew()
        held = await b.view("m", "", ["w1"], None, None, {})
        assert held.workers == {"w1": 2} and held.backlogs["w1"][:2] == (2.5, 1)
        a.give(ranked)
        await a.settle()
        held = await b.view("m", "", ["w1"], None, None, {})
        assert held.workers == {"w1": 1} and held.backlogs["w1"][:2] == (0.0, 0) and held.backlogs["w1"].busy_s > 0
        # Redis loses its data: the renewal puts the lease back, with when it started
        await a._redis.delete(f"{prefix}:l:w:w1", f"{prefix}:lw:w1")
        await a._renew()
        held = await b.view("m", "", ["w1"], None, None, {})
        assert held.workers == {"w1": 1} and held.backlogs["w1"].busy_s >= 0.8
    finally:
        await a.close()
        await b.close()
        await dead.close()


async def test_redis_away_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis stops: the replica serves on its own counts, each cap its share of the replicas last seen; Redis is
    back: what is in flight is registered once, and the shared counts hold again."""
    monkeypatch.setattr(redis_occupancy, "RETRY_S", 0.1)
    monkeypatch.setattr(redis_occupancy, "REJOIN_S", 0.3)
    changes: list[bool] = []
    with redis_server() as url:
        prefix = f"t{uuid.uuid4().hex[:8]}"
        other = redis_keeper(url, prefix)
        await other.start()  # a second replica: each one's share of a cap is half
        keeper = redis_keeper(url, prefix, on_change=changes.append)
        await keeper.start()
        assert keeper.replicas == 2 and changes == [True]
        port = url.rsplit(":", 1)[1].split("/")[0]
        await other.close()
    try:
        caps = Caps(worker=4)
        assert await keeper.take(grant(caps=caps)) is None  # Redis is gone: found out, served here
        assert not keeper.up and changes == [True, False]
        assert await keeper.take(grant(caps=caps)) is None
        assert await keeper.take(grant(caps=caps)) == "worker"  # half of 4 on this replica
        with redis_server(port=int(port)) as again:
            assert again == url
            for _ in range(100):
                if keeper.up:
                    break
                await asyncio.sleep(0.05)
            assert keeper.up and changes == [True, False, True]
            # just back, it keeps to its share (the other replica may not be back yet: what it takes on its own
            # counts is not in Redis): the two taken meanwhile, registered in Redis, fill it
            assert await keeper.take(grant(caps=caps)) == "worker"
            await asyncio.sleep(redis_occupancy.REJOIN_S)
            # the two taken meanwhile are Redis's now (and counted once): two more fit under the cap of 4
            assert await keeper.take(grant(caps=caps)) is None
            assert await keeper.take(grant(caps=caps)) is None
            assert await keeper.take(grant(caps=caps)) == "worker"
    finally:
        await keeper.close()


async def test_rate_limits_away_and_back() -> None:
    """The rate limits, Redis away: counted on this replica, each limit its share; back: counted in Redis again,
    what was counted meanwhile not added (nothing counted twice)."""
    from turnout.gateway.limiter import RateLimited, RedisLimiter, Subject

    with redis_server() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
    limiter = RedisLimiter(url, timeout_s=0.5, replicas=lambda: 2, retry_s=0.1)
    subject = Subject(f"k{uuid.uuid4().hex[:6]}", rpm=4, daily_tokens=None)
    try:
        assert (await limiter.admit(subject, 1)).member == ""  # Redis is away: admitted here
        assert not limiter.up
        await limiter.admit(subject, 1)
        with pytest.raises(RateLimited):
            await limiter.admit(subject, 1)  # half of 4 on this replica
        with redis_server(port=port):
            await asyncio.sleep(0.15)
            decisions = [await limiter.admit(subject, 1) for _ in range(4)]  # Redis's window: 4 (none of the 2)
            assert limiter.up and all(d.member for d in decisions)
            with pytest.raises(RateLimited):
                await limiter.admit(subject, 1)
    finally:
        await limiter.close()


async def test_what_is_in_flight_when_redis_goes_counts_against_the_share() -> None:
    """Two requests in flight, taken through Redis, when Redis goes: the replica's own counts start with them, so a
    worker capped at 2 gets no third (it got up to its share more: 4 at once with three replicas, bench/shared.py)."""
    with redis_server() as url:
        keeper = redis_keeper(url)
        await keeper.start()
        caps = Caps(worker=2)
        held = [grant(caps=caps), grant(caps=caps)]
        for g in held:
            assert await keeper.take(g) is None
    try:
        assert await keeper.take(grant(caps=caps)) == "worker"  # Redis is gone; the two still run
        assert not keeper.up
        keeper.give(held[0])
        assert await keeper.take(grant(caps=caps)) is None  # one given back: one fits
    finally:
        await keeper.close()


async def test_a_take_counts_the_live_replicas(redis_url: str) -> None:
    """A replica that started first learns of the others at its next take, not only at its next renewal (3 s): its
    share of a cap, should Redis go, is never the whole cap because it started first."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    first = redis_keeper(redis_url, prefix)
    await first.start()
    assert first.replicas == 1
    second = redis_keeper(redis_url, prefix)
    await second.start()
    try:
        assert await first.take(grant()) is None
        assert first.replicas == 2
    finally:
        await second.close()
        await first.close()


def test_ids_are_unique_across_processes_and_forks() -> None:
    """Leases and tickets of every replica meet in Redis: two processes (and a forked child, as `serve --workers N`
    makes them) never make the same id (two replicas' first leases were both ``l1``: one lease in Redis, so a
    worker's cap let one request more through)."""
    code = "from turnout.gateway.occupancy import next_id; print(next_id('l'))"
    made = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()}
    made.add(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out at once
        os.write(write, next_id("l").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(write)
    made.add(os.read(read, 100).decode())
    os.close(read)
    made.add(next_id("l"))
    assert len(made) == 4, made


async def test_a_tenants_waiting_batch_does_not_put_its_interactive_requests_behind_others(keeper: Occupancy) -> None:
    """Fair queueing keeps its tags per class: tenant a's four waiting batch requests do not tag its interactive
    request behind tenant b's three later interactive ones (it was served after all three when one tag per tenant
    ran across the classes)."""
    for _ in range(4):
        assert await keeper.join("m", "a", 1, Priority.BATCH, 100) is not None
    mine = await keeper.join("m", "a", 1, Priority.INTERACTIVE, 100)
    theirs = [await keeper.join("m", "b", 1, Priority.INTERACTIVE, 100) for _ in range(3)]
    assert mine is not None and all(t is not None for t in theirs)
    for ticket in theirs:
        assert await keeper.take(grant(tenant="b", ticket=ticket)) == "ahead"
    assert await keeper.take(grant(tenant="a", ticket=mine)) is None
