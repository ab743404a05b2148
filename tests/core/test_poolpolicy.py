import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnout.core.poolpolicy import (
    KvDemand,
    KvUnfit,
    PolicyError,
    PoolPolicy,
    may_idle_sleep,
    parse_pool_policy,
    plan_kv,
)

P = 2 << 20  # page


def test_valid_policy() -> None:
    policy = parse_pool_policy(
        '{"reclaim":{"mode":"kv-first","capacityBytes":1000,"guaranteedFloorPercent":10},'
        '"lifecycle":{"sleepAfterSeconds":300}}'
    )
    assert (policy.capacity_bytes, policy.floor_percent, policy.sleep_after_s) == (1000, 10.0, 300.0)
    assert parse_pool_policy("{}").sleep_after_s is None
    assert policy.sleep_by_stop is False
    assert parse_pool_policy('{"lifecycle":{"sleepAfterSeconds":9,"sleepByStop":true}}').sleep_by_stop is True


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be an object"),
        ('{"reclaim":{"mode":"lru"}}', "kv-first"),
        ('{"reclaim":{"capacityBytes":-1}}', "positive integer"),
        ('{"reclaim":{"guaranteedFloorPercent":120}}', "0 to 100"),
        ('{"lifecycle":{"sleepAfterSeconds":0}}', "positive number"),
        ('{"lifecycle":{"sleepAfter":10}}', "unknown field"),
        ('{"reclaim":{},"extra":1}', "unknown field"),
        ('{"lifecycle":{"sleepByStop":"yes"}}', "sleepByStop must be true or false"),
        ('{"lifecycle":{"sleepByStop":1}}', "sleepByStop must be true or false"),
        ('{"lifecycle":{"sleep_by_stop":true}}', "unknown field"),
    ],
)
def test_invalid_policy(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        parse_pool_policy(text)


def d(model: str, used: int = 0, inflight: int | None = 0, done: int | None = 0, prealloc: int = 0) -> KvDemand:
    return KvDemand(model, used * P, prealloc * P, inflight, done)


@pytest.mark.parametrize(
    ("capacity_pages", "models", "floor", "expected_pages"),
    [
        (10, [d("a", inflight=3), d("b", inflight=1)], 0, {"a": 8, "b": 2}),  # demand-weighted (7.5/2.5)
        (10, [d("a", used=6), d("b", inflight=4)], 0, {"a": 6, "b": 4}),  # used pages are protected
        (10, [d("a", used=2, prealloc=2), d("b", inflight=1)], 0, {"a": 4, "b": 6}),  # so are preallocated ones
        (10, [d("a", inflight=100), d("b")], 20, {"a": 8, "b": 2}),  # floor 20% guaranteed to idle b
        # base is max(floor, used + prealloc): b's 3 used pages already cover its 20% floor (not 3 + 2)
        (10, [d("a", inflight=1), d("b", used=3)], 20, {"a": 7, "b": 3}),
        (10, [d("a", inflight=1), d("b", used=1)], 30, {"a": 7, "b": 3}),  # b's floor over its used pages
        # the remainder goes to the active models only: idle c keeps its base (its floor), nothing more
        (10, [d("a", inflight=1), d("b", done=1), d("c")], 10, {"a": 5, "b": 4, "c": 1}),
        (10, [d("a", inflight=1000, done=10**6), d("b", inflight=64)], 0, {"a": 9, "b": 1}),  # demand is bounded
        (10, [d("a", done=10**6), d("b", done=1024)], 0, {"a": 5, "b": 5}),  # completion deltas too
        (9, [d("a", inflight=1), d("b", inflight=1), d("c", inflight=1)], 0, {"a": 3, "b": 3, "c": 3}),
        (10, [d("b", inflight=1), d("a", inflight=1), d("c", inflight=1)], 0, {"a": 4, "b": 3, "c": 3}),  # ties
    ],
)
def test_plan(capacity_pages: int, models: list[KvDemand], floor: float, expected_pages: dict[str, int]) -> None:
    plan = plan_kv(capacity_pages * P, models, floor)
    assert plan is not None and {k: v // P for k, v in plan.limits.items()} == expected_pages
    assert sum(plan.limits.values()) <= capacity_pages * P
    assert plan.floors_scaled is None and plan.floor_bytes == capacity_pages * P * floor // 100


@pytest.mark.parametrize(
    "models",
    [
        [d("a"), d("b")],  # nobody was observed active: nothing to redistribute by
        [d("a", used=3), d("b", used=2)],
        [d("a", inflight=1), d("b", inflight=None)],  # demand not observable
        [d("a", inflight=1, done=None)],
        [],
    ],
)
def test_no_plan(models: list[KvDemand]) -> None:
    assert plan_kv(10 * P, models, 0) is None


@pytest.mark.parametrize(
    ("models", "floor"),
    [
        ([d("a", used=8, inflight=1), d("b", used=3)], 0),  # used pages exceed the capacity
        ([d("a", used=8, inflight=1), d("b", used=2, prealloc=1)], 50),  # so do used + preallocated ones
    ],
)
def test_protected_pages_that_do_not_fit_are_no_plan_with_a_reason(models: list[KvDemand], floor: float) -> None:
    """Used + preallocated pages over the capacity are the one reason to refuse a plan."""
    with pytest.raises(KvUnfit, match=r"used \+ preallocated.*over reclaim\.capacityBytes"):
        plan_kv(10 * P, models, floor)


def test_protected_pages_are_counted_in_whole_pages() -> None:
    """Half a page used is a whole page held: two models each 5.5 pages in use do not fit 11 pages."""
    half = P // 2
    models = [KvDemand("a", 5 * P + half, 0, 1, 0), KvDemand("b", 5 * P + half, 0, 1, 0)]
    with pytest.raises(KvUnfit):
        plan_kv(11 * P, models, 0)
    plan = plan_kv(12 * P, models, 0)
    assert plan is not None and plan.limits == {"a": 6 * P, "b": 6 * P}


def test_six_models_at_a_twenty_percent_floor_get_a_plan_with_scaled_floors() -> None:
    """The issue's case: six 20 % floors are 120 % of the capacity with nothing used. The floors are lowered
    to the highest common floor that fits (the capacity split evenly) and the plan says so."""
    models = [d(m, inflight=1 if m == "a" else 0) for m in "abcdef"]
    plan = plan_kv(60 * P, models, 20)
    assert plan is not None
    assert plan.limits == {m: 10 * P for m in "abcdef"}
    assert plan.floor_bytes == 10 * P
    assert plan.floors_scaled is not None
    assert "guaranteedFloorPercent 20" in plan.floors_scaled and "6 models" in plan.floors_scaled
    assert f"{10 * P} bytes (16.7 %)" in plan.floors_scaled


@pytest.mark.parametrize(
    ("models", "floor", "expected_pages"),
    [
        # three 40 % floors (12 of 10 pages) with nothing used: 10/3 pages each, leftover page by name
        ([d("a", inflight=1), d("b"), d("c")], 40, {"a": 4, "b": 3, "c": 3}),
        # a's 7 used pages are protected; b is lifted to what is left (3), not to its 40 % floor
        ([d("a", used=7, inflight=1), d("b")], 40, {"a": 7, "b": 3}),
        # b's 6 used pages are above any floor; a and c share the other 4 pages as their floor
        ([d("a", inflight=1), d("b", used=6), d("c")], 30, {"a": 2, "b": 6, "c": 2}),
    ],
)
def test_floors_that_do_not_fit_are_lowered_to_fit(
    models: list[KvDemand], floor: float, expected_pages: dict[str, int]
) -> None:
    plan = plan_kv(10 * P, models, floor)
    assert plan is not None and plan.floors_scaled is not None
    assert {k: v // P for k, v in plan.limits.items()} == expected_pages


@given(
    capacity=st.integers(min_value=1, max_value=200),
    floor=st.floats(min_value=0, max_value=100),
    rows=st.lists(
        st.tuples(st.integers(0, 40 * P), st.integers(0, 4 * P), st.integers(0, 100), st.integers(0, 2000)),
        min_size=1,
        max_size=8,
    ),
)
def test_a_plan_whenever_the_protected_pages_fit(
    capacity: int, floor: float, rows: list[tuple[int, int, int, int]]
) -> None:
    """Whatever the floors: with protected pages that fit there is a plan (once a model is active), it stays
    within the capacity, gives every model its protected pages, and every model at least the (possibly lowered)
    common floor rounded down; with protected pages that do not fit, KvUnfit."""
    models = [KvDemand(f"m{i}", used, pre, inflight, done) for i, (used, pre, inflight, done) in enumerate(rows)]
    protected = {m.model: -(-(m.used_bytes + m.prealloc_bytes) // P) for m in models}
    active = any(m.inflight or m.completions_delta for m in models)
    if sum(protected.values()) > capacity:
        if active:
            with pytest.raises(KvUnfit):
                plan_kv(capacity * P, models, floor)
        return
    plan = plan_kv(capacity * P, models, floor)
    if not active:
        assert plan is None
        return
    assert plan is not None
    assert sum(plan.limits.values()) <= capacity * P
    assert all(plan.limits[n] >= u * P for n, u in protected.items())
    assert all(plan.limits[n] >= plan.floor_bytes // P * P for n in protected)
    assert plan.floor_bytes <= capacity * P * floor / 100 + 1
    assert (plan.floors_scaled is None) == (sum(max(capacity * floor / 100, u) for u in protected.values()) <= capacity)


@pytest.mark.parametrize(
    ("by_stop", "engine", "in_place", "accelerators", "sleeps"),
    [
        (False, "vllm", True, 1, True),  # the design: vLLM (with sleep mode) on a single GPU, and only that
        (False, "sglang", True, 1, False),  # SGLang sleeps in place too, but idles into sleep only with the switch
        (False, "", True, 1, False),  # an engine the snapshot does not name (an AIBrix runtime's)
        (False, "vllm", False, 1, False),  # vLLM without sleep mode (sleeps by stopping): only with the switch
        (False, "llamacpp", False, 1, False),  # llama.cpp (sleeps by stopping) on a GPU: only with the switch
        (False, "vllm", True, 0, False),  # CPU pod: only with the switch
        (False, "llamacpp", False, 0, False),
        (False, "vllm", True, 2, False),  # several GPUs: never
        (True, "sglang", True, 1, True),
        (True, "llamacpp", False, 1, True),
        (True, "vllm", True, 0, True),
        (True, "llamacpp", False, 0, True),
        (True, "vllm", True, 2, False),
        (True, "sglang", True, 4, False),
    ],
)
def test_which_engines_may_idle_into_sleep(
    by_stop: bool, engine: str, in_place: bool, accelerators: int, sleeps: bool
) -> None:
    policy = PoolPolicy(sleep_after_s=30, sleep_by_stop=by_stop)
    assert may_idle_sleep(policy, engine, in_place, accelerators) is sleeps
