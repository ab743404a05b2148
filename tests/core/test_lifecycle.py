"""Pool policy application per tick: idle sleep, KV limits, invalid-policy events (pure, table-driven)."""

from __future__ import annotations

import json

import pytest

from turnout.core.lifecycle import (
    EngineObservation,
    PolicyEvent,
    PoolMemory,
    SetKvLimit,
    SleepIdle,
    pool_step,
)

P = 2 << 20
SLEEPY = '{"lifecycle":{"sleepAfterSeconds":30}}'
KV = json.dumps({"reclaim": {"mode": "kv-first", "capacityBytes": 10 * P, "guaranteedFloorPercent": 0}})


def obs(
    model: str = "a",
    running: int | None = 0,
    waiting: int | None = 0,
    done: int | None = 0,
    phase: str = "active",
    kv: int | None = None,
    cap: int | None = None,
    in_place: bool = True,
    engine: str = "vllm",
) -> EngineObservation:
    return EngineObservation(
        f"claim-{model}", model, phase, phase == "active", kv, 0, cap, running, waiting, done, in_place, engine
    )


def run(
    policy: str | None, ticks: list[tuple[float, list[EngineObservation]]], gpus: int = 1, accelerators: int = 1
) -> list[list[object]]:
    """Feed observations tick by tick (carrying memory) and collect each tick's actions."""
    memory = PoolMemory()
    out: list[list[object]] = []
    for now, engines in ticks:
        step = pool_step("pod", gpus, policy, engines, memory, now, accelerators=accelerators)
        memory = step.memory
        out.append(step.actions)
    return out


@pytest.mark.parametrize(
    ("ticks", "sleeps_at"),
    [
        # idle from the first observation: sleeps once 30 s of idle observations have passed
        ([(0, [obs()]), (10, [obs()]), (29, [obs()]), (30, [obs()])], [3]),
        # a completion in between restarts the idle run
        ([(0, [obs()]), (20, [obs(done=1)]), (40, [obs(done=1)]), (69, [obs(done=1)]), (70, [obs(done=1)])], [4]),
        # a running request is not idle
        ([(0, [obs()]), (40, [obs(running=1)]), (60, [obs()])], []),
        # waiting requests are not idle either
        ([(0, [obs()]), (40, [obs(waiting=2)])], []),
        # an unobservable tick breaks the run: idle must be proven by complete observations
        ([(0, [obs()]), (20, [obs(running=None)]), (40, [obs()]), (69, [obs()]), (70, [obs()])], [4]),
        # an engine that is not active (booting, sleeping) never idles into sleep
        ([(0, [obs(phase="sleeping")]), (100, [obs(phase="sleeping")])], []),
    ],
)
def test_idle_sleep(ticks: list[tuple[float, list[EngineObservation]]], sleeps_at: list[int]) -> None:
    actions = run(SLEEPY, ticks)
    got = [i for i, acts in enumerate(actions) if any(isinstance(a, SleepIdle) for a in acts)]
    assert got == sleeps_at


SHORT = '{"lifecycle":{"sleepAfterSeconds":5}}'  # shorter than the Retry-After the gateway gives (10 s)
ASLEEP, BOOTING = obs(phase="sleeping"), obs(phase="booting")


@pytest.mark.parametrize(
    ("ticks", "sleeps_at"),
    [
        # never asleep: 5 s of idle after it is first seen ready
        ([(0, [obs()]), (4, [obs()]), (5, [obs()])], [2]),
        # woken (asleep at 0, ready at 1): its idle clock starts at 1, and it stays awake WOKEN_HOLD_S (20 s)
        ([(0, [ASLEEP]), (1, [obs()]), (6, [obs()]), (11, [obs()]), (20.9, [obs()]), (21, [obs()])], [5]),
        # on its way up in between (a wake in place boots): the hold counts from when it is ready
        ([(0, [ASLEEP]), (1, [BOOTING]), (3, [obs()]), (22.9, [obs()]), (23, [obs()])], [4]),
        # the policy's own sleep counts as asleep: the engine woken right after it is held too
        ([(0, [obs()]), (5, [obs()]), (6, [obs()]), (11, [obs()]), (25.9, [obs()]), (26, [obs()])], [1, 5]),
        # a request in the hold restarts the idle run (from the next idle observation), which needs its own 5 s
        ([(0, [ASLEEP]), (1, [obs()]), (20, [obs(done=1)]), (24, [obs(done=1)]), (28.9, [obs(done=1)])], []),
        ([(0, [ASLEEP]), (1, [obs()]), (20, [obs(done=1)]), (24, [obs(done=1)]), (29, [obs(done=1)])], [4]),
        # put to sleep at 21, woken again by 40: held again
        ([(0, [ASLEEP]), (1, [obs()]), (21, [obs()]), (40, [obs()]), (45, [obs()]), (60, [obs()])], [2, 5]),
    ],
)
def test_a_wake_is_activity(ticks: list[tuple[float, list[EngineObservation]]], sleeps_at: list[int]) -> None:
    """Issue 32, item 15: with sleepAfterSeconds (5) under the Retry-After (10), an engine woken by a request used
    to be asleep again before the client retried."""
    actions = run(SHORT, ticks)
    got = [i for i, acts in enumerate(actions) if any(isinstance(a, SleepIdle) for a in acts)]
    assert got == sleeps_at


def test_sleep_action_names_claim_and_idle_time() -> None:
    actions = run(SLEEPY, [(0, [obs()]), (31, [obs()])])
    assert actions[1] == [SleepIdle("pod", "claim-a", "a", 31)]


def test_only_idle_engines_sleep() -> None:
    ticks: list[tuple[float, list[EngineObservation]]] = [
        (0, [obs("a"), obs("b")]),
        (30, [obs("a"), obs("b", running=1)]),
    ]
    assert [a for a in run(SLEEPY, ticks)[1] if isinstance(a, SleepIdle)] == [SleepIdle("pod", "claim-a", "a", 30)]


def test_no_policy_or_no_lifecycle_never_sleeps() -> None:
    ticks: list[tuple[float, list[EngineObservation]]] = [(0, [obs()]), (1000, [obs()])]
    assert run(None, ticks) == [[], []]
    assert run('{"reclaim":{"mode":"kv-first"}}', ticks) == [[], []]


def test_invalid_policy_reported_once_per_text() -> None:
    memory = PoolMemory()
    events = []
    for text in ['{"lifecycle":{"sleepAfter":1}}', '{"lifecycle":{"sleepAfter":1}}', "{bad", "{bad", SLEEPY, "{bad"]:
        step = pool_step("pod", 1, text, [obs()], memory, 0, accelerators=1)
        memory = step.memory
        events.append([a for a in step.actions if isinstance(a, PolicyEvent)])
        if text != SLEEPY:
            assert step.policy_valid is False
    assert [len(e) for e in events] == [1, 0, 1, 0, 0, 1]
    assert events[0][0].reason == "InvalidPoolPolicy" and "unknown field" in events[0][0].message


def test_invalid_policy_disables_sleep() -> None:
    ticks: list[tuple[float, list[EngineObservation]]] = [(0, [obs()]), (1000, [obs()])]
    actions = run('{"lifecycle":{"sleepAfterSeconds":30},"x":1}', ticks)
    assert not any(isinstance(a, SleepIdle) for acts in actions for a in acts)


@pytest.mark.parametrize(
    ("second", "gpus", "expected"),
    [
        # demand 3:1 of the 10 pages -> 8/2 (7.5/2.5 rounded by largest remainder, ties by name)
        ([obs("a", running=3, kv=0, cap=5 * P), obs("b", running=1, kv=0, cap=5 * P)], 1, {"a": 8 * P, "b": 2 * P}),
        # unchanged limits are not sent again
        ([obs("a", kv=0, cap=5 * P), obs("b", kv=0, cap=5 * P)], 1, {}),
        # multi-GPU pods are left alone
        ([obs("a", running=3, kv=0, cap=5 * P), obs("b", kv=0, cap=5 * P)], 2, {}),
        # an engine without a kvcached segment makes KV unobservable: no plan
        ([obs("a", running=3, kv=0, cap=5 * P), obs("b")], 1, {}),
        # an engine whose requests cannot be observed: no plan
        ([obs("a", running=None, kv=0, cap=5 * P), obs("b", kv=0, cap=5 * P)], 1, {}),
        # protected pages over the capacity: no plan
        ([obs("a", kv=8 * P, cap=5 * P), obs("b", kv=3 * P, cap=5 * P)], 1, {}),
    ],
)
def test_kv_limits(second: list[EngineObservation], gpus: int, expected: dict[str, int]) -> None:
    first = [obs(e.model, kv=e.kv_used_bytes, cap=e.kv_capacity_bytes) for e in second]
    actions = run(KV, [(0, first), (5, second)], gpus=gpus)
    assert actions[0] == [] or all(isinstance(a, SetKvLimit) for a in actions[0])
    assert {a.model: a.limit_bytes for a in actions[1] if isinstance(a, SetKvLimit)} == expected


def test_first_observation_plans_nothing() -> None:
    """Completions since the last plan are unknown on the first tick: demand is not observable yet."""
    actions = run(KV, [(0, [obs("a", running=3, kv=0, cap=5 * P), obs("b", kv=0, cap=5 * P)])])
    assert actions == [[]]


def test_completions_count_as_demand() -> None:
    ticks: list[tuple[float, list[EngineObservation]]] = [
        (0, [obs("a", done=100, kv=0, cap=5 * P), obs("b", done=7, kv=0, cap=5 * P)]),
        (5, [obs("a", done=103, kv=0, cap=5 * P), obs("b", done=8, kv=0, cap=5 * P)]),
    ]
    limits = {a.model: a.limit_bytes for a in run(KV, ticks)[1] if isinstance(a, SetKvLimit)}
    assert limits == {"a": 8 * P, "b": 2 * P}


def test_engine_not_serving_keeps_its_pages_and_shrinks_first() -> None:
    """A booting engine with a segment is in the plan (protected pages, no demand), and limits that shrink are
    sent before those that grow, so the pool never holds more than its capacity in between."""
    ticks: list[tuple[float, list[EngineObservation]]] = [
        (0, [obs("a", running=3, kv=0, cap=5 * P), obs("b", phase="booting", kv=2 * P, cap=5 * P)]),
        (5, [obs("a", running=3, kv=0, cap=5 * P), obs("b", phase="booting", kv=2 * P, cap=5 * P)]),
    ]
    actions = run(KV, ticks)[1]
    assert actions == [SetKvLimit("pod", "b", 2 * P), SetKvLimit("pod", "a", 8 * P)]


BY_STOP = '{"lifecycle":{"sleepAfterSeconds":30,"sleepByStop":true}}'


@pytest.mark.parametrize(
    ("policy", "engine", "in_place", "accelerators", "sleeps"),
    [
        (SLEEPY, "vllm", True, 1, True),  # the design: vLLM with sleep mode on one GPU (as the snapshot says)
        (SLEEPY, "sglang", True, 1, False),  # SGLang sleeps in place, yet idles into sleep only with the switch
        (SLEEPY, "llamacpp", False, 1, False),  # llama.cpp sleeps by stopping: Turnout's extension, off by default
        (SLEEPY, "vllm", False, 1, False),  # vLLM with --no-enable-sleep-mode sleeps by stopping: the same
        (SLEEPY, "vllm", True, 0, False),  # a CPU pod (no GPU in the snapshot), whatever the pod's limits say
        (SLEEPY, "vllm", True, 2, False),  # several GPUs
        (BY_STOP, "sglang", True, 1, True),
        (BY_STOP, "llamacpp", False, 1, True),
        (BY_STOP, "llamacpp", False, 0, True),  # llama.cpp on a CPU pool, as the runtime tests run it
        (BY_STOP, "vllm", True, 2, False),
    ],
)
def test_idle_sleep_is_vllm_on_one_gpu_or_the_switch(
    policy: str, engine: str, in_place: bool, accelerators: int, sleeps: bool
) -> None:
    ticks = [(0.0, [obs(in_place=in_place, engine=engine)]), (31.0, [obs(in_place=in_place, engine=engine)])]
    actions = run(policy, ticks, accelerators=accelerators)
    assert any(isinstance(a, SleepIdle) for a in actions[1]) is sleeps


def test_kv_protected_pages_that_do_not_fit_are_reported_once_per_run() -> None:
    """Used pages over the capacity: no plan, one KvPlanUnfit event when it starts (not every tick), and another
    one only after a plan fitted in between."""

    def tick(used: int) -> list[EngineObservation]:
        return [obs("a", running=1, kv=used * P, cap=5 * P), obs("b", running=1, kv=4 * P, cap=5 * P)]

    ticks = [(0.0, tick(7)), (5.0, tick(7)), (10.0, tick(7)), (15.0, tick(5)), (20.0, tick(7)), (25.0, tick(7))]
    actions = run(KV, ticks)
    events = [[a for a in acts if isinstance(a, PolicyEvent)] for acts in actions]
    assert [len(e) for e in events] == [0, 1, 0, 0, 1, 0]
    assert events[1][0].reason == "KvPlanUnfit" and "reclaim.capacityBytes" in events[1][0].message
    assert not any(isinstance(a, SetKvLimit) for i in (0, 1, 2, 4, 5) for a in actions[i])
    # at 15 s the 9 used pages fit: the free page goes by demand (equal: largest remainder, ties by name)
    assert {a.model: a.limit_bytes for a in actions[3] if isinstance(a, SetKvLimit)} == {"a": 6 * P, "b": 4 * P}


def test_kv_floors_that_do_not_fit_are_scaled_and_reported_once_per_run() -> None:
    """Six engines at a 20 % floor with nothing used (120 % of the capacity): a plan all the same, with each
    floor lowered to a sixth, and one KvFloorsScaled event when that starts, again only after a tick whose floors
    fitted."""
    floors = json.dumps({"reclaim": {"mode": "kv-first", "capacityBytes": 60 * P, "guaranteedFloorPercent": 20}})

    def tick(n: int) -> list[EngineObservation]:
        return [obs(m, running=1 if m == "a" else 0, kv=0, cap=5 * P) for m in "abcdef"[:n]]

    # the first tick has no completion deltas yet (not observable); at 15 s four engines' floors fit; e and f
    # are new again at 20 s (not observable yet)
    ticks = [(0.0, tick(6)), (5.0, tick(6)), (10.0, tick(6)), (15.0, tick(4)), (20.0, tick(6)), (25.0, tick(6))]
    actions = run(floors, ticks)
    events = [[a for a in acts if isinstance(a, PolicyEvent)] for acts in actions]
    assert [len(e) for e in events] == [0, 1, 0, 0, 0, 1]
    assert events[1][0].reason == "KvFloorsScaled" and "guaranteedFloorPercent 20" in events[1][0].message
    limits = {a.model: a.limit_bytes for a in actions[1] if isinstance(a, SetKvLimit)}
    assert limits == {m: 10 * P for m in "abcdef"}
    # four floors of 12 pages fit (48 of 60): the active engine gets the other 12
    four = {a.model: a.limit_bytes for a in actions[3] if isinstance(a, SetKvLimit)}
    assert four == {"a": 24 * P, "b": 12 * P, "c": 12 * P, "d": 12 * P}


def test_no_kv_plan_until_a_model_is_observed_active() -> None:
    ticks = [(0.0, [obs("a", kv=0, cap=3 * P), obs("b", kv=0, cap=3 * P)])] * 3
    assert run(KV, ticks) == [[], [], []]  # nobody asked: the capacities stay as they are
