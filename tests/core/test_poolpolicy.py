import pytest

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
    assert plan is not None and {k: v // P for k, v in plan.items()} == expected_pages
    assert sum(plan.values()) <= capacity_pages * P


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
        ([d("a", inflight=1), d("b"), d("c")], 40),  # three 40% floors: not scaled down to fit
        ([d("a", used=7, inflight=1), d("b")], 40),  # a's used pages and b's floor
    ],
)
def test_bases_that_do_not_fit_are_no_plan_with_a_reason(models: list[KvDemand], floor: float) -> None:
    with pytest.raises(KvUnfit, match=r"reclaim\.guaranteedFloorPercent"):
        plan_kv(10 * P, models, floor)


@pytest.mark.parametrize(
    ("by_stop", "in_place", "accelerators", "sleeps"),
    [
        (False, True, 1, True),  # the design: in-place sleep on a single GPU
        (False, False, 1, False),  # llama.cpp (sleep by stop) on a GPU: only with the switch
        (False, True, 0, False),  # CPU pod: only with the switch
        (False, False, 0, False),
        (False, True, 2, False),  # several GPUs: never
        (True, False, 1, True),
        (True, True, 0, True),
        (True, False, 0, True),
        (True, True, 2, False),
        (True, False, 4, False),
    ],
)
def test_which_engines_may_idle_into_sleep(by_stop: bool, in_place: bool, accelerators: int, sleeps: bool) -> None:
    assert may_idle_sleep(PoolPolicy(sleep_after_s=30, sleep_by_stop=by_stop), in_place, accelerators) is sleeps
