"""The occupancy kept in Redis, for any number of gateway replicas (``storage.redis_url``).

Requests in flight are leases (:mod:`turnout.gateway.redis_scripts`): taken atomically against every cap and the
queue's order, given back when the request ends, renewed by their replica every :data:`RENEW_S`, and gone
:data:`LEASE_S` after their replica stopped renewing them (a replica killed, a machine lost), by Redis's clock. The
queue is one sorted set per model: a slot given back is published (``P:freed``), and each replica's first waiter
for that model routes again; only the first waiter of all (the fair order) can take it, whichever replica holds it.
What any replica sends a worker is recorded in that worker's index in Redis, so the next turn of a conversation
finds it whichever replica it reaches. A batch request a replica offers to stop (:meth:`RedisOccupancy.offer`) is
in every other replica's view; one that stops it claims it in Redis (once) and its replica hears it on ``P:stop``.

A routed request costs one round trip to read (:meth:`RedisOccupancy.view`: the counts, each candidate's prefix
index, the queue, the batch requests offered to stop) and one to take; a request with a single candidate worker that
may stop no batch request only the take (it checks every cap).
Giving back, renewing and the replica's heartbeat are sent off the request's path.

**Redis away or slow** (a reply later than ``storage.redis_timeout_ms``): the replica goes on with a
:class:`~turnout.gateway.occupancy.LocalOccupancy` of its own, each cap cut to its share (the cap over the replicas
last seen alive, at least one), logs it once, shows it (``up``: ``/healthz``, the metric
``turnout_shared_state_up``, the Overview), and tries Redis again every :data:`RETRY_S`; back, it registers the
requests it has in flight (each once: what ran meanwhile and ended is not counted again) and says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnout.core.admission import CLASS_BAND, Caps, Priority, queue_score
from turnout.core.preemption import Running
from turnout.core.prefix import Match, PrefixIndex, Prompt, match_of
from turnout.core.routing import Backlog
from turnout.gateway.occupancy import Grant, Held, LocalOccupancy, Ticket, next_id, woken
from turnout.gateway.redis_scripts import GIVE, GIVE_KEYS, JOIN, STOP, TAKE, VIEW

__all__ = ["LEASE_S", "RENEW_S", "RETRY_S", "RedisOccupancy"]

log = logging.getLogger("turnout.gateway")

LEASE_S = 10.0  # a replica that stops renewing gives its slots back this long after its last renewal
RENEW_S = 3.0
RETRY_S = 1.0  # Redis away: tried again this often
RECHECK_S = 1.0  # a waiter routes again at least this often (a missed wake costs at most this)
# Back after an outage, a replica keeps to its share of each cap this long: the other replicas come back within a
# retry of it, and until they do, what they take on their own counts is not in Redis.
REJOIN_S = 2 * RETRY_S + 0.5
_AWAY = "\x00away"  # a take's answer when Redis could not be asked: taken on this replica's own counts
_KEY = struct.Struct("<Q")


def _pack(prompt: Prompt | None) -> tuple[bytes, bytes]:
    if prompt is None:
        return b"", b""
    keys = b"".join(_KEY.pack(k) for k in prompt.keys)
    return keys, (b"" if prompt.session is None else _KEY.pack(prompt.session))


def _cap(value: int | None) -> int:
    return -1 if value is None else value


class RedisOccupancy:
    """``url``: Redis; ``prefix``: its keys' prefix; ``timeout_s``: a reply later than this is Redis away;
    ``index``: this process's own prefix index per worker (kept too, for the time Redis is away); ``tenant_caps``
    as for :class:`LocalOccupancy`; ``max_blocks``/``max_sessions``/``prefix_ttl_s``: the index's bounds."""

    remote = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnout",
        timeout_s: float = 0.25,
        index: Callable[[str], PrefixIndex | None],
        tenant_caps: Mapping[str, int | None],
        max_blocks: int,
        max_sessions: int,
        prefix_ttl_s: float,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        import redis.asyncio as redis

        self.replica = uuid.uuid4().hex[:12]
        self._redis = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._pubsub_redis = redis.from_url(url, socket_connect_timeout=max(timeout_s, 1.0))
        self._p = prefix
        self._view = self._redis.register_script(VIEW)
        self._take = self._redis.register_script(TAKE)
        self._join = self._redis.register_script(JOIN)
        self._give_script = self._redis.register_script(GIVE)
        self._stop_script = self._redis.register_script(STOP)
        self._offered: dict[str, tuple[Grant, Callable[[], None]]] = {}  # this replica's lines others may stop
        self._giving: list[Grant] = []  # given back and not sent to Redis yet (sent together, once a loop turn)
        self._given: asyncio.Future[None] | None = None  # done once the gives of the batch being sent are in Redis
        self._rejoined = -REJOIN_S  # when this replica last came back after an outage (time.monotonic())
        self._taking: list[tuple[Grant, asyncio.Future[str | None]]] = []  # asked for, likewise
        self._index = index
        self._tenant_caps = {k: v for k, v in tenant_caps.items() if v is not None}
        self._max_blocks, self._max_sessions = max_blocks, max_sessions
        self._ttl_ms = int(prefix_ttl_s * 1000)
        self._on_change = on_change
        self.local = LocalOccupancy(index, clock=time.monotonic, tenant_caps=tenant_caps, prefix_ttl_s=prefix_ttl_s)
        self.up = True
        self.replicas = 1  # replicas last seen alive (this one included): each one's share of a cap while away
        self.round_trips = 0  # on requests' paths (view, take), for the cost bench
        self._mine: dict[str, Grant] = {}  # leases taken in Redis and not given back
        self._started: dict[str, str] = {}  # their ``<work_ms>|<start_ms>`` (put back by a renewal, Redis emptied)
        self._here: set[str] = set()  # leases taken while Redis was away (in ``local``)
        self._tickets: dict[str, Ticket] = {}  # this replica's waiters in Redis's queues
        self._scores: dict[str, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._renew()
        except Exception as exc:
            self._down(exc)
        if self.up and self._on_change is not None:
            self._on_change(True)
        self._tasks = [
            asyncio.create_task(self._renewing(), name="turnout-occupancy-renew"),
            asyncio.create_task(self._listening(), name="turnout-occupancy-freed"),
        ]

    async def close(self) -> None:
        """Stop renewing and listening (this replica's leases expire by themselves if it could not give them back)."""
        self._closing = True
        if self._giving and self.up:
            await self._give(self._given)  # what was given back last goes now, not with the leases' expiry
        for task in self._tasks:
            task.cancel()
        if self._tasks or self._background:
            await asyncio.wait([*self._tasks, *self._background], timeout=1.0)
        for client in (self._redis, self._pubsub_redis):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), 1.0)

    # -- reading -----------------------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._tickets) + self.local.waiting

    async def view(
        self,
        model: str,
        tenant: str,
        workers: Sequence[str],
        prompt: Prompt | None,
        ticket: Ticket | None,
        slots: Mapping[str, int | None],
        *,
        offers: bool = True,
    ) -> Held:
        if not self.up:
            return self.local.held(model, tenant, workers, prompt, self._local_ticket(ticket), slots)
        keys, session = _pack(prompt)
        args: list[Any] = [self._p, model, tenant, self._ticket_id(ticket), self._ttl_ms, len(workers)]
        for worker in workers:
            args += [worker, _cap(slots.get(worker))]
        args += [keys, session, "1" if offers else "0"]
        try:
            reply = await self._view(args=args)
        except Exception as exc:
            self._down(exc)
            return self.local.held(model, tenant, workers, prompt, self._local_ticket(ticket), slots)
        self.round_trips += 1
        now, total, in_model, in_tenant, ahead, in_batch = (int(x) for x in reply[:6])
        counts: dict[str, int] = {}
        matches: dict[str, Match] = {}
        backlogs: dict[str, Backlog] = {}
        n = len(workers)
        for worker, entry in zip(workers, reply[6 : 6 + n], strict=True):
            counts[worker] = int(entry[0])
            work_ms, ranked, oldest = int(entry[1]), int(entry[2]), int(entry[3])
            backlogs[worker] = Backlog(work_ms / 1000, ranked, max(now - oldest, 0) / 1000 if oldest >= 0 else 0.0)
            if prompt is not None and len(entry) > 4:
                matches[worker] = _match(prompt, entry[4:], slots.get(worker), now)
        lines = self._offered_elsewhere(model, reply[6 + n] if len(reply) > 6 + n else [], now)
        return Held(total, in_model, in_tenant, counts, matches, bool(ahead), backlogs, in_batch, lines)

    def _offered_elsewhere(self, model: str, flat: Sequence[Any], now_ms: int) -> tuple[Running, ...]:
        """The view's batch requests offered to stop (worker, lease, replica, ``<work_ms>|<start_ms>``, flat), less
        this replica's own (its dispatcher's), with when each started in this process's monotonic seconds."""
        here = time.monotonic()
        lines = []
        for i in range(0, len(flat) - 3, 4):
            worker, lease, replica, started = (_text(x) for x in flat[i : i + 4])
            if replica == self.replica:
                continue
            work_ms, _, start_ms = started.partition("|")
            age_s = max(now_ms - int(start_ms), 0) / 1000 if int(start_ms) >= 0 else 0.0
            work = int(work_ms) / 1000 if int(work_ms) >= 0 else None
            lines.append(Running(lease, worker, model, here - age_s, work))
        return tuple(lines)

    # -- taking and giving back --------------------------------------------------------------------------------
    async def take(self, grant: Grant) -> str | None:
        if not self.up:
            return self._take_here(grant)
        if time.monotonic() - self._rejoined < REJOIN_S:
            grant = grant._replace(caps=self._share(grant.caps))
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if not self._taking:  # the first of this loop turn: they go together, in one script, just after it
            asyncio.get_running_loop().call_soon(lambda: self._spawn(self._take_all()))
        self._taking.append((grant, future))
        refused = await future
        if refused == _AWAY:
            return self._take_here(grant)
        return refused

    async def _take_all(self) -> None:
        """Take the slots asked for since the last time, in one script: each checked against the ones before it."""
        asked, self._taking = self._taking, []
        if not asked:
            return
        args: list[Any] = [self._p, int(LEASE_S * 1000), CLASS_BAND, self._max_blocks, self._max_sessions, self._ttl_ms]
        for grant, _ in asked:
            keys, session = _pack(grant.prompt)
            args += [grant.lease, grant.model, grant.tenant, grant.worker, 1 if grant.priority is Priority.BATCH else 0]
            args += [*(_cap(c) for c in grant.caps), self._ticket_id(grant.ticket), keys]
            args += [0 if grant.prompt is None else grant.prompt.size, session, _work_ms(grant)]
            args.append(-1 if grant.seen is None else grant.seen)
        try:
            replies = await self._take(args=args)
        except Exception as exc:
            self._down(exc)
            for _, future in asked:
                if not future.done():
                    future.set_result(_AWAY)
            return
        self.round_trips += 1
        started = int(replies.pop())
        self.replicas = max(int(replies.pop()), 1)  # known at every take, not only every renewal
        for (grant, future), reply in zip(asked, replies, strict=True):
            answer = reply.decode() if isinstance(reply, bytes) else str(reply)
            if answer == "ok":
                self._started[grant.lease] = f"{_work_ms(grant)}|{started}"
                self._taken(grant)
            if not future.done():
                future.set_result(None if answer == "ok" else answer)

    def _taken(self, grant: Grant) -> None:
        self._mine[grant.lease] = grant
        if grant.ticket is not None:
            self._tickets.pop(grant.ticket.id, None)
            self._scores.pop(grant.ticket.id, None)
            self._spawn(self._publish(grant.model))  # the next in line may go now (a held one, once ready)
        if grant.prompt is not None:  # this process's own index too: what routing falls back on without Redis
            index = self._index(grant.worker)
            if index is not None:
                index.record(grant.prompt, time.monotonic())

    def _take_here(self, grant: Grant) -> str | None:
        share = self._share(grant.caps)
        local = grant._replace(caps=share, ticket=self._local_ticket(grant.ticket), seen=None)  # (seen: Redis's)
        refused = self.local.take_now(local)
        if refused is None:
            self._here.add(grant.lease)
            self._mine[grant.lease] = grant
        return refused

    def _share(self, caps: Caps) -> Caps:
        """Each cap cut to this replica's share while Redis is away (at least one)."""
        n = max(self.replicas, 1)
        return Caps(*(None if c is None else max(1, math.floor(c / n)) for c in caps))

    def offer(self, grant: Grant, since: float, on_stop: Callable[[], None]) -> None:
        self._offered[grant.lease] = (grant, on_stop)
        if self.up:
            self._spawn(self._offer(grant))

    async def _offer(self, grant: Grant) -> None:
        if grant.lease not in self._offered:
            return  # given back already
        with contextlib.suppress(Exception):  # (the renewal notices Redis away, and offers it again once back)
            await self._redis.hset(*self._offer_entry(grant))

    def _offer_entry(self, grant: Grant) -> tuple[str, str, str]:
        """Where a batch request offered to stop is kept in Redis: its worker's hash, its lease, ``<replica>|<model>``
        (what VIEW and STOP read: :mod:`turnout.gateway.redis_scripts`)."""
        return f"{self._p}:ls:{grant.worker}", grant.lease, f"{self.replica}|{grant.model}"

    async def stop(self, line: Running) -> bool:
        if not self.up:
            return False
        try:
            return bool(await self._stop_script(args=[self._p, line.worker, line.lease]))
        except Exception as exc:
            self._down(exc)
            return False

    def _stop_asked(self, lease: str) -> None:
        """Another replica claimed this replica's batch request ``lease`` (``P:stop``): stop it."""
        offered = self._offered.pop(lease, None)
        if offered is not None:
            offered[1]()

    def give(self, grant: Grant) -> None:
        self._offered.pop(grant.lease, None)
        self._mine.pop(grant.lease, None)
        self._started.pop(grant.lease, None)
        if grant.lease in self._here:
            self._here.discard(grant.lease)
            self.local.give(grant)
        if self.up:
            if not self._giving:  # the first of this loop turn: they go together, in one script, just after it
                loop = asyncio.get_running_loop()
                given = self._given = loop.create_future()
                loop.call_soon(lambda: self._spawn(self._give(given)))
            self._giving.append(grant)

    async def settle(self) -> None:
        given = self._given
        if given is not None:
            await asyncio.shield(given)

    async def _give(self, given: asyncio.Future[None] | None = None) -> None:
        """Give back the leases given since the last time, in one script (it wakes waiters only when any wait)."""
        grants, self._giving = self._giving, []
        try:
            if not grants:
                return
            args: list[Any] = [self._p]
            for g in grants:
                args += [g.lease, g.model, g.tenant, g.worker, 1 if g.priority is Priority.BATCH else 0]
            try:
                await self._give_script(args=args)
            except Exception as exc:  # (their leases expire by themselves)
                self._down(exc)
        finally:
            if given is not None:
                if self._given is given:
                    self._given = None
                if not given.done():
                    given.set_result(None)

    # -- the queue ---------------------------------------------------------------------------------------------
    async def join(self, model: str, tenant: str, weight: int, priority: Priority, max_queue: int) -> Ticket | None:
        ticket_id = f"{self.replica}:{next_id('w')}"
        if not self.up:
            share = max(1, math.floor(max_queue / max(self.replicas, 1)))
            return self.local.join_now(model, tenant, weight, priority, share, ticket_id)
        args: list[Any] = [self._p, model, tenant, weight, priority.rank, ticket_id, max_queue]
        args += [int(LEASE_S * 1000), CLASS_BAND]
        try:
            reply = await self._join(args=args)
        except Exception as exc:
            self._down(exc)
            return self.local.join_now(model, tenant, weight, priority, max_queue, ticket_id)
        if reply is None:
            return None
        tag = float(reply)
        ticket = Ticket(ticket_id, model, tenant, priority, tag, time.monotonic())
        self._tickets[ticket_id] = ticket
        self._scores[ticket_id] = queue_score(priority, tag, 0.0)
        return ticket

    async def wait(self, ticket: Ticket, limit_s: float) -> bool:
        if ticket.id not in self._tickets:  # a ticket of the local queue (Redis was away when it joined)
            return await self.local.wait(ticket, limit_s)
        await woken(ticket, min(limit_s, RECHECK_S))
        return True  # routes again either way: a wake may have been missed

    def leave(self, ticket: Ticket) -> None:
        if self._tickets.pop(ticket.id, None) is None:
            self.local.leave(ticket)
            return
        self._scores.pop(ticket.id, None)
        if self.up:
            self._spawn(self._leave(ticket))

    async def _publish(self, model: str) -> None:
        try:
            await self._redis.publish(f"{self._p}:freed", model)
        except Exception as exc:
            self._down(exc)

    async def _leave(self, ticket: Ticket) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zrem(f"{self._p}:q:{ticket.model}", ticket.id)
                pipe.zrem(f"{self._p}:qx", ticket.id)
                pipe.hdel(f"{self._p}:qt:{ticket.model}", ticket.id)
                pipe.publish(f"{self._p}:freed", ticket.model)  # the next in line may go now
                await pipe.execute()
        except Exception as exc:
            self._down(exc)

    def wake_all(self) -> None:
        self.local.wake_all()
        for model in {t.model for t in self._tickets.values()}:
            self._wake(model)

    def _wake(self, model: str) -> None:
        """This replica's first waiter for ``model`` routes again (only the first of all replicas' can take)."""
        now = time.monotonic()
        mine = [t for t in self._tickets.values() if t.model == model]
        if mine:
            min(mine, key=lambda t: t.waiter(now).score).woken.set()

    def _ticket_id(self, ticket: Ticket | None) -> str:
        return ticket.id if ticket is not None and ticket.id in self._tickets else ""

    def _local_ticket(self, ticket: Ticket | None) -> Ticket | None:
        return None if ticket is None or ticket.id in self._tickets else ticket

    # -- in the background -------------------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _renewing(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S if self.up else RETRY_S)
            try:
                await self._renew()
            except Exception as exc:
                self._down(exc)

    async def _renew(self) -> None:
        """Every lease and ticket of this replica stays (or is put back, after Redis lost them), its heartbeat, the
        tenants' caps; the live replicas counted. Back after an outage: the requests in flight are registered."""
        now = time.monotonic()
        seconds, micros = await self._redis.time()
        until = int(seconds) * 1000 + int(micros) // 1000 + int(LEASE_S * 1000)
        redis_now = until - int(LEASE_S * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for grant, _ in self._offered.values():  # (offered meanwhile, Redis away; or lost, Redis restarted)
                pipe.hset(*self._offer_entry(grant))
            for grant in self._mine.values():
                for key in _lease_keys(self._p, grant):
                    pipe.zadd(key, {grant.lease: until})
                started = self._started.get(grant.lease)
                if started is None:  # taken while Redis was away: it starts now, as far as the others know
                    started = self._started[grant.lease] = f"{_work_ms(grant)}|{redis_now}"
                pipe.hset(f"{self._p}:lw:{grant.worker}", grant.lease, started)
            for ticket in self._tickets.values():
                score = queue_score(ticket.priority, ticket.tag, now - ticket.since)
                if ticket.priority is Priority.BATCH and score != self._scores.get(ticket.id):
                    self._scores[ticket.id] = score  # waited BATCH_AGEING_S: served as a standard request now
                pipe.zadd(f"{self._p}:q:{ticket.model}", {ticket.id: score})
                pipe.hset(f"{self._p}:qt:{ticket.model}", ticket.id, ticket.tenant)
                pipe.zadd(f"{self._p}:qx", {ticket.id: until})
            if self._tenant_caps:
                pipe.hset(f"{self._p}:tcap", mapping={k: v for k, v in self._tenant_caps.items()})
            pipe.zadd(f"{self._p}:reps", {self.replica: until})
            pipe.zremrangebyscore(f"{self._p}:reps", "-inf", redis_now)
            pipe.zcard(f"{self._p}:reps")
            reply = await pipe.execute()
        # back after an outage, the replicas seen before it count until the next renewal (a Redis restarted empty
        # knows only those back already)
        self.replicas = max(int(reply[-1]), 1 if self.up else self.replicas, 1)
        if not self.up:
            self._here.clear()  # those in flight are Redis's now (registered above); the local counts start over
            self.local = LocalOccupancy(
                self._index, clock=time.monotonic, tenant_caps=self._tenant_caps, prefix_ttl_s=self._ttl_ms / 1000
            )
            self.up = True
            self._rejoined = time.monotonic()
            log.info("shared routing state is back (Redis answers): %d replicas share the counts", self.replicas)
            if self._on_change is not None:
                self._on_change(True)
            self.wake_all()

    async def _listening(self) -> None:
        """Wake this replica's first waiters when a slot is given back anywhere; stop this replica's batch request
        that another replica claimed (``P:stop``)."""
        channel, stops = f"{self._p}:freed", f"{self._p}:stop"
        while True:
            pubsub = self._pubsub_redis.pubsub()
            try:
                await pubsub.subscribe(channel, stops)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = _text(message["data"])
                        if _text(message.get("channel")) == stops:
                            self._stop_asked(data)
                            continue
                        model = data
                        self._wake(model)
                        for other in {t.model for t in self._tickets.values()} - {model}:
                            self._wake(other)
            except asyncio.CancelledError:
                raise
            except Exception:  # the renewal notices Redis away; listen again shortly
                if self._closing:  # redis-py turns the cancellation of a read into a connection error
                    return
                await asyncio.sleep(RETRY_S)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), 1.0)

    def _down(self, exc: BaseException) -> None:
        if not self.up:
            return
        self.up = False
        log.warning(
            "shared routing state unavailable (Redis: %s): serving on this replica's own counts, each cap cut to "
            "its share of %d replicas, until Redis answers again",
            f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            self.replicas,
        )
        if self._on_change is not None:
            self._on_change(False)
        for lease, grant in self._mine.items():  # in flight: counted here too, so its worker's share is not exceeded
            if lease not in self._here:
                self.local.carry(grant)
                self._here.add(lease)
        for ticket in self._tickets.values():
            ticket.woken.set()  # its waiters route again, on this replica's own state


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lease_keys(prefix: str, grant: Grant) -> list[str]:
    return GIVE_KEYS(prefix, grant.model, grant.tenant, grant.worker, grant.priority is Priority.BATCH)


def _work_ms(grant: Grant) -> int:
    return -1 if grant.work is None else round(grant.work * 1000)


def _match(prompt: Prompt, entry: Sequence[Any], slots: int | None, now_ms: int) -> Match:
    latest, recent, evicted_at, evicted_size, session_send, session_size, sends = entry[:7]
    evicted = None if int(evicted_at) < 0 else (int(evicted_at) / 1000, int(evicted_size))
    session = None if int(session_send) < 0 else (int(session_send), int(session_size))
    return match_of(prompt, [int(s) for s in sends], int(recent), int(latest), slots, session, evicted, now_ms / 1000)
