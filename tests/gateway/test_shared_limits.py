"""The limits of `turnout serve --workers N` (turnout.gateway.shared_limits): the supervisor's keeper and each
process's limiter, over real socket pairs; the keeper is served on this test's event loop as the supervisor's
select loop serves it."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Callable

import pytest

from turnout.core.limits import DAY_S, Decision
from turnout.errors import Unavailable
from turnout.gateway import shared_limits
from turnout.gateway.limiter import LocalLimiter, RateLimited, Subject
from turnout.gateway.shared_limits import LimitKeeper, SharedLimiter

NOW = 1_800_000_000.0  # the keeper's clock, set by the tests


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


Processes = Callable[[int], list[SharedLimiter]]


@pytest.fixture
async def keeper() -> AsyncIterator[tuple[LimitKeeper, Clock, Processes]]:
    """A keeper served on the loop, and a maker of process-side limiters connected to it."""
    clock = Clock()
    keeper = LimitKeeper(clock)
    loop = asyncio.get_running_loop()
    made: list[SharedLimiter] = []

    def processes(n: int) -> list[SharedLimiter]:
        for _ in range(n):
            before = set(keeper.fds)
            theirs = keeper.connect()
            (fd,) = set(keeper.fds) - before  # the end the keeper kept
            loop.add_reader(fd, keeper.serve, fd)
            made.append(SharedLimiter(theirs))
        return made[-n:]

    yield keeper, clock, processes
    for fd in list(keeper.fds):
        loop.remove_reader(fd)
    for limiter in made:
        await limiter.close()
    keeper.close()


async def test_admissions_from_several_processes_are_counted_once(
    keeper: tuple[LimitKeeper, Clock, Processes],
) -> None:
    _, _, processes = keeper
    a, b, c = processes(3)
    subject = Subject("k1", 25, None)

    async def admit(limiter: SharedLimiter) -> bool:
        try:
            await limiter.admit(subject, 10)
        except RateLimited:
            return False
        return True

    results = await asyncio.gather(*(admit(p) for _ in range(20) for p in (a, b, c)))
    assert results.count(True) == 25
    with pytest.raises(RateLimited) as refused:
        await a.admit(subject, 10)
    assert "rate limit of 25 requests per minute" in refused.value.message
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"


async def test_decisions_are_a_single_processs_decisions(keeper: tuple[LimitKeeper, Clock, Processes]) -> None:
    """The same sequence of admissions, settlements and releases, through the keeper and in one process's
    memory: the same decisions and refusals (both decide with turnout.core.limits)."""
    _, clock, processes = keeper
    (shared,) = processes(1)
    local = LocalLimiter()
    subject = Subject("k7", 3, 1000, 'tenant "t": ')
    outcomes: dict[str, list[object]] = {"shared": [], "local": []}
    for name, limiter in (("shared", shared), ("local", local)):
        for step, estimate in enumerate((400, 300, 400, 200, 100)):
            try:
                decision = await limiter.admit(subject, estimate)
            except RateLimited as exc:
                outcomes[name].append(("refused", exc.message, exc.headers))
                continue
            if step == 0:
                await limiter.settle(subject, decision, estimate, 50)  # used 50 of the 400 reserved
            if step == 1:
                await limiter.release(subject, decision, estimate)  # another limit refused it: all undone
            outcomes[name].append(
                ("admitted", decision.rpm_remaining, decision.tokens_remaining, decision.tokens_limit)
            )
        subject = Subject("k8", 3, 1000, 'tenant "t": ')  # a fresh subject for the second limiter
    # the keeper's clock is fixed; the local limiter's is the real one: only the rate window's reset differs
    for shared_step, local_step in zip(outcomes["shared"], outcomes["local"], strict=True):
        if shared_step[0] == "refused":
            assert shared_step[1] == local_step[1]
        else:
            assert shared_step == local_step
    assert [step[0] for step in outcomes["shared"]] == ["admitted", "admitted", "admitted", "admitted", "refused"]
    assert clock.now == NOW


async def test_a_window_and_a_day_pass_on_the_keepers_clock(keeper: tuple[LimitKeeper, Clock, Processes]) -> None:
    _, clock, processes = keeper
    a, b = processes(2)
    subject = Subject("k2", 2, 100)
    await a.admit(subject, 60)
    with pytest.raises(RateLimited, match="daily token limit of 100"):
        await b.admit(subject, 60)
    clock.now += DAY_S  # a new day: the budget starts over; the minute has passed too
    await b.admit(subject, 60)
    await a.admit(subject, 30)
    with pytest.raises(RateLimited, match="rate limit of 2"):
        await a.admit(subject, 1)
    clock.now += 61
    assert (await a.admit(subject, 1)).rpm_remaining == 1


async def test_a_supervisor_gone_refuses_at_once_with_503(keeper: tuple[LimitKeeper, Clock, Processes]) -> None:
    owner, _, processes = keeper
    (a,) = processes(1)
    subject = Subject("k3", 5, None)
    await a.admit(subject, 1)
    loop = asyncio.get_running_loop()
    for fd in list(owner.fds):
        loop.remove_reader(fd)
    owner.close()
    await asyncio.sleep(0.05)  # the process notices the closed channel
    with pytest.raises(Unavailable) as refused:
        await a.admit(subject, 1)
    assert refused.value.status == 503 and refused.value.code == "limits_unavailable"
    assert "supervisor" in refused.value.message
    reservation = Decision(True, day=int(NOW // DAY_S), at=NOW)
    await a.settle(Subject("k3", 5, 100), reservation, 5, 1)  # these do not raise: a lost one errs on the strict side
    await a.release(Subject("k3", 5, 100), reservation, 5)


async def test_an_admission_not_answered_in_time_is_refused(
    keeper: tuple[LimitKeeper, Clock, Processes], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, _, processes = keeper
    (a,) = processes(1)
    monkeypatch.setattr(shared_limits, "_ANSWER_S", 0.05)
    loop = asyncio.get_running_loop()
    for fd in list(owner.fds):
        loop.remove_reader(fd)  # a supervisor that stopped answering
    with pytest.raises(Unavailable, match="did not answer within"):
        await a.admit(Subject("k4", 5, None), 1)


async def test_a_process_that_sends_garbage_is_dropped_and_the_others_go_on(
    keeper: tuple[LimitKeeper, Clock, Processes],
) -> None:
    owner, _, processes = keeper
    good, bad = processes(2)
    bad_sock = bad._sock
    bad_sock.sendall(struct.pack("!I", 1 << 30))  # a length no process sends
    await asyncio.sleep(0.05)
    assert len(owner.fds) == 1
    assert (await good.admit(Subject("k5", 5, None), 1)).allowed
    bad_sock.settimeout(1)
    assert bad_sock.recv(1) == b""  # the keeper closed its end


def test_frames_are_split_whatever_the_reads() -> None:
    """One frame per message however the bytes arrive: byte by byte, several at once, a length cut in two."""
    messages = [[1, "admit", "k1", 5, None, 10], [0, "settle", "k1", 3, 10, 4], [2, "admit", "t:x" * 50, 1, 2, 3]]
    stream = b"".join(shared_limits._frame(m) for m in messages)
    for cut in (1, 2, 3, 5, 7, len(stream)):
        frames = shared_limits._Frames()
        got: list[bytes] = []
        for start in range(0, len(stream), cut):
            got += frames.feed(stream[start : start + cut])
        assert [shared_limits.orjson.loads(f) for f in got] == messages
    with pytest.raises(ValueError, match="a frame of"):
        shared_limits._Frames().feed(struct.pack("!I", shared_limits._MAX_FRAME + 1))


def test_the_keepers_ends_are_what_it_selects_on() -> None:
    owner = LimitKeeper()
    theirs = [owner.connect() for _ in range(3)]
    assert len(owner.fds) == 3 and all(isinstance(s, socket.socket) for s in theirs)
    theirs[0].close()
    owner.serve(min(owner.fds))  # reads the end of the closed one: dropped
    assert len(owner.fds) == 2
    owner.close()
    for sock in theirs[1:]:
        sock.close()
