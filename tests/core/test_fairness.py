import pytest

from turnout.core.fairness import WeightedRoundRobin


def run(picks: list[list[str]], weights: dict[str, int]) -> list[str | None]:
    rr = WeightedRoundRobin()
    return [rr.pick(c, lambda t: weights.get(t, 1)) for c in picks]


@pytest.mark.parametrize(
    ("picks", "weights", "expected"),
    [
        ([["a", "b"]] * 4, {}, ["a", "b", "a", "b"]),
        ([["a", "b"]] * 6, {"a": 2}, ["a", "a", "b", "a", "a", "b"]),
        ([["a"], ["a"], ["a", "b"], ["a", "b"]], {}, ["a", "a", "b", "a"]),
        ([["a", "b", "c"]] * 3, {}, ["a", "b", "c"]),
        ([["b"], ["a", "b"]], {}, ["b", "a"]),
        ([[]], {}, [None]),
        # a tenant that cannot go right now is skipped, not waited for
        ([["a", "b"], ["a"], ["a", "b"]], {}, ["a", "a", "b"]),
    ],
)
def test_pick(picks: list[list[str]], weights: dict[str, int], expected: list[str | None]) -> None:
    assert run(picks, weights) == expected
