import pytest

from turnout.core.poolpolicy import KvDemand, PolicyError, parse_pool_policy, plan_kv

P = 2 << 20  # page


def test_valid_policy() -> None:
    policy = parse_pool_policy(
        '{"reclaim":{"mode":"kv-first","capacityBytes":1000,"guaranteedFloorPercent":10},'
        '"lifecycle":{"sleepAfterSeconds":300}}'
    )
    assert (policy.capacity_bytes, policy.floor_percent, policy.sleep_after_s) == (1000, 10.0, 300.0)
    assert parse_pool_policy("{}").sleep_after_s is None


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
    ],
)
def test_invalid_policy(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        parse_pool_policy(text)


def d(model: str, used: int = 0, inflight: int | None = 0, done: int | None = 0) -> KvDemand:
    return KvDemand(model, used * P, 0, inflight, done)


@pytest.mark.parametrize(
    ("capacity_pages", "models", "floor", "expected_pages"),
    [
        (10, [d("a"), d("b")], 0, {"a": 5, "b": 5}),  # nobody asks: even split
        (10, [d("a", inflight=3), d("b", inflight=1)], 0, {"a": 8, "b": 2}),  # demand-weighted (7.5/2.5)
        (10, [d("a", used=6), d("b", inflight=4)], 0, {"a": 6, "b": 4}),  # used pages are protected
        (10, [d("a", inflight=100), d("b")], 20, {"a": 8, "b": 2}),  # floor 20% guaranteed to idle b
        (10, [d("a", inflight=1000, done=10**6), d("b", inflight=64)], 0, {"a": 9, "b": 1}),  # demand is bounded
        (9, [d("a"), d("b"), d("c")], 0, {"a": 3, "b": 3, "c": 3}),
        (10, [d("b"), d("a"), d("c")], 0, {"a": 4, "b": 3, "c": 3}),  # deterministic: leftover by name
    ],
)
def test_plan(capacity_pages: int, models: list[KvDemand], floor: float, expected_pages: dict[str, int]) -> None:
    plan = plan_kv(capacity_pages * P, models, floor)
    assert plan is not None and {k: v // P for k, v in plan.items()} == expected_pages
    assert sum(plan.values()) <= capacity_pages * P


@pytest.mark.parametrize(
    "models",
    [
        [d("a", used=8), d("b", used=3)],  # protected pages exceed the capacity
        [d("a"), d("b", inflight=None)],  # demand not observable
        [d("a", done=None)],
    ],
)
def test_no_plan(models: list[KvDemand]) -> None:
    assert plan_kv(10 * P, models, 0) is None


def test_empty() -> None:
    assert plan_kv(10 * P, [], 10) == {}
