import pytest

from turnout.core.placement import PlacementRules
from turnout.core.routing import Capacity, NoRoute, NoRouteReason, Route, WorkerView, installed_name, route

M = "llama3:8b"
ALLOW = PlacementRules.parse("allow_all")
DENY_M = PlacementRules.parse("allow_all", [], [M])
WL_OTHER = PlacementRules.parse("whitelist", ["qwen3:*"])


def w(name: str, **kw: object) -> WorkerView:
    base = WorkerView(name=name, healthy=True, rules=ALLOW, inventory=frozenset({M}))
    return base._replace(**kw)


def pick(decision: Route | NoRoute) -> str:
    assert isinstance(decision, Route), decision
    return decision.best.worker


@pytest.mark.parametrize(
    ("workers", "reason", "fragment"),
    [
        ([], NoRouteReason.NO_WORKERS, "no workers are configured"),
        # every worker down: each one's reason, from the health snapshot
        (
            [w("a", healthy=False, down_reason="connection refused"), w("b", healthy=False, down_reason="timeout")],
            NoRouteReason.NO_HEALTHY,
            'no healthy worker for "llama3:8b": a down (connection refused), b down (timeout)',
        ),
        ([w("a", healthy=False)], NoRouteReason.NO_HEALTHY, 'no healthy worker for "llama3:8b": a down'),
        ([w("a", rules=DENY_M)], NoRouteReason.BLOCKED, 'a: denied by rule "llama3:8b"'),
        ([w("a", rules=WL_OTHER)], NoRouteReason.BLOCKED, "a: not in its whitelist"),
        ([w("a", rules=DENY_M), w("b", healthy=False, rules=DENY_M)], NoRouteReason.BLOCKED, "blocked by placement"),
        # installed only where blocked
        (
            [w("a", rules=DENY_M), w("b", inventory=frozenset({"x"}))],
            NoRouteReason.NOT_INSTALLED,
            "not installed on any eligible worker",
        ),
        # installed only on an unhealthy worker: down, not missing (a 503 naming it, never a 404)
        (
            [w("a", healthy=False, down_reason="timeout"), w("b", inventory=frozenset({"x"}))],
            NoRouteReason.NO_HEALTHY,
            'model "llama3:8b" is installed only on a, which is down (timeout)',
        ),
        (
            [w("a", healthy=False), w("b", inventory=frozenset())],
            NoRouteReason.NO_HEALTHY,
            'model "llama3:8b" is installed only on a, which is down (not answering)',
        ),
        # ... or on a worker where this model is out: the same, with the model's reason
        (
            [w("a", model_out="requests failing: HTTP 500"), w("b", inventory=frozenset({"x"}))],
            NoRouteReason.NO_HEALTHY,
            'model "llama3:8b" is installed only on a, which is down (requests failing: HTTP 500)',
        ),
        (
            [
                w("a", model_out="requests failing: HTTP 500"),
                w("b", healthy=False, down_reason="connection refused"),
                w("c", inventory=frozenset({"x"})),
            ],
            NoRouteReason.NO_HEALTHY,
            "installed only on a and b, which are down (a: requests failing: HTTP 500; b: connection refused)",
        ),
        # held by a down worker whose placement blocks it: that one would not serve it anyway
        (
            [w("a", healthy=False, rules=DENY_M), w("b", inventory=frozenset({"x"}))],
            NoRouteReason.NOT_INSTALLED,
            "not installed on any eligible worker",
        ),
        # held by a down worker, blocked on the healthy one: down, not blocked
        (
            [w("a", healthy=False, down_reason="timeout"), w("b", rules=DENY_M)],
            NoRouteReason.NO_HEALTHY,
            "installed only on a, which is down (timeout)",
        ),
        # the only holder's model is out and nothing else is up: every worker named
        (
            [w("a", model_out="requests failing: invalid answer")],
            NoRouteReason.NO_HEALTHY,
            'no healthy worker for "llama3:8b": a down for this model (requests failing: invalid answer)',
        ),
        # nowhere at all, every inventory known
        (
            [w("a", inventory=frozenset()), w("b", inventory=frozenset({"x"}))],
            NoRouteReason.UNKNOWN_MODEL,
            "is not installed on any eligible worker",
        ),
        # nowhere and blocked everywhere: it's an unknown model, not a placement problem
        (
            [w("a", rules=WL_OTHER, inventory=frozenset())],
            NoRouteReason.UNKNOWN_MODEL,
            "is not installed on any eligible worker",
        ),
        ([w("a", max_concurrent=1, in_flight=1)], NoRouteReason.SATURATED, "busy (a)"),
    ],
)
def test_no_route(workers: list[WorkerView], reason: NoRouteReason, fragment: str) -> None:
    decision = route(M, workers)
    assert isinstance(decision, NoRoute)
    assert decision.reason is reason
    assert fragment in decision.message


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        # unhealthy dropped
        ([w("a", healthy=False), w("b")], "b"),
        # a worker where this model is out is dropped for it, even when loaded
        ([w("a", model_out="requests failing: HTTP 500", loaded=frozenset({M})), w("b")], "b"),
        # excluded like unhealthy (failed attempt)
        ([w("a"), w("b")], "a"),
        # blocked dropped even when better in every other way
        ([w("a", rules=DENY_M, loaded=frozenset({M})), w("b")], "b"),
        # inventory known to hold the model beats unknown inventory
        ([w("a", inventory=None, loaded=frozenset({M})), w("b")], "b"),
        # unknown inventory fails open when nobody is known to have it
        ([w("a", inventory=None), w("b", inventory=frozenset({"x"}))], "a"),
        # loaded affinity
        ([w("a"), w("b", loaded=frozenset({M}))], "b"),
        # load
        ([w("a", in_flight=3, max_concurrent=4), w("b", in_flight=1, max_concurrent=4)], "b"),
        # saturated workers are skipped
        ([w("a", in_flight=4, max_concurrent=4, loaded=frozenset({M})), w("b")], "b"),
        # learned speed
        ([w("a", tokens_per_s=10.0), w("b", tokens_per_s=50.0)], "b"),
        # unknown speed is neutral: better than the slow one, worse than the fast one
        ([w("a", tokens_per_s=10.0), w("b"), w("c", tokens_per_s=50.0)], "c"),
        # one known value has nothing to compare with: a tie, broken by order
        ([w("a", tokens_per_s=10.0), w("b")], "a"),
        ([w("b"), w("a", tokens_per_s=10.0)], "b"),
        # GPU utilisation and VRAM pressure
        ([w("a", gpu_util=0.9), w("b", gpu_util=0.1)], "b"),
        ([w("a", vram_pressure=0.5), w("b", vram_pressure=0.0)], "b"),
        ([w("a", gpu_util=0.9), w("b"), w("c", gpu_util=0.1)], "c"),
        # loaded affinity outweighs a busier slot
        ([w("a", loaded=frozenset({M}), in_flight=2, max_concurrent=4), w("b")], "a"),
        # placement allows by prefix
        ([w("a", rules=PlacementRules.parse("whitelist", ["llama3:*"]))], "a"),
    ],
)
def test_route_picks(workers: list[WorkerView], expected: str) -> None:
    assert pick(route(M, workers)) == expected


def test_exclude() -> None:
    assert pick(route(M, [w("a"), w("b")], exclude=frozenset({"a"}))) == "b"
    decision = route(M, [w("a"), w("b", healthy=False, down_reason="timeout")], exclude=frozenset({"a"}))
    assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.NO_HEALTHY
    assert decision.message == 'no healthy worker for "llama3:8b": a failed for this request, b down (timeout)'


@pytest.mark.parametrize(
    ("capacity", "fragment"),
    [
        (Capacity(global_in_flight=256, global_max=256), "gateway is at its limit of 256"),
        (Capacity(model_in_flight=8, model_max=8), 'model "llama3:8b" is at its limit of 8'),
    ],
)
def test_capacity(capacity: Capacity, fragment: str) -> None:
    decision = route(M, [w("a")], capacity)
    assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.SATURATED
    assert fragment in decision.message


def test_capacity_below_limit_routes() -> None:
    assert pick(route(M, [w("a")], Capacity(global_in_flight=1, global_max=2, model_in_flight=7, model_max=8))) == "a"


def test_rotation_breaks_ties_round_robin() -> None:
    workers = [w("a"), w("b"), w("c")]
    assert [pick(route(M, workers, rotation=r)) for r in range(4)] == ["a", "b", "c", "a"]


def test_candidates_are_failover_order() -> None:
    decision = route(M, [w("a"), w("b", loaded=frozenset({M})), w("c", in_flight=5)])
    assert isinstance(decision, Route)
    assert [c.worker for c in decision.candidates] == ["b", "a", "c"]


@pytest.mark.parametrize(
    ("model", "inventory", "expected"),
    [
        ("gemma4", frozenset({"gemma4:latest"}), "gemma4:latest"),
        ("gemma4:latest", frozenset({"gemma4:latest"}), "gemma4:latest"),
        ("gemma4", frozenset({"gemma4"}), "gemma4"),
        ("gemma4:2b", frozenset({"gemma4:latest"}), None),
        ("org/gemma4", frozenset({"org/gemma4:latest"}), "org/gemma4:latest"),
        ("gemma4", None, None),
        ("gemma4:latest", frozenset({"gemma4"}), "gemma4"),
    ],
)
def test_installed_name(model: str, inventory: frozenset[str] | None, expected: str | None) -> None:
    assert installed_name(model, inventory) == expected


def test_latest_tag_resolves_for_placement_and_upstream_name() -> None:
    rules = PlacementRules.parse("whitelist", ["gemma4:*"])
    decision = route("gemma4", [w("a", rules=rules, inventory=frozenset({"gemma4:latest"}))])
    assert isinstance(decision, Route)
    assert decision.best.model == "gemma4:latest"


def test_absent_inputs_rank_between_known_ones() -> None:
    decision = route(M, [w("a", gpu_util=0.9), w("b"), w("c", gpu_util=0.1)])
    assert isinstance(decision, Route)
    assert [c.worker for c in decision.candidates] == ["c", "b", "a"]
    decision = route(M, [w("a", tokens_per_s=5.0), w("b"), w("c", tokens_per_s=50.0)])
    assert isinstance(decision, Route)
    assert [c.worker for c in decision.candidates] == ["c", "b", "a"]


def test_a_tagless_rule_blocks_the_latest_tag_it_means() -> None:
    """The rule shown as blocking "gemma4" blocks a request for "gemma4" served as "gemma4:latest"."""
    rules = PlacementRules.parse("allow_all", [], ["gemma4"])
    for model in ("gemma4", "gemma4:latest"):
        decision = route(model, [w("a", rules=rules, inventory=frozenset({"gemma4:latest"}))])
        assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.BLOCKED, model


def test_a_worker_known_not_to_hold_the_model_is_never_picked() -> None:
    known_without = w("a", inventory=frozenset({"other:1b"}))
    unknown = w("b", inventory=None)
    decision = route("m:1b", [known_without, unknown])
    assert isinstance(decision, Route)
    assert [c.worker for c in decision.candidates] == ["b"]
    holder = w("c", inventory=frozenset({"m:1b"}))
    decision = route("m:1b", [known_without, unknown, holder])
    assert isinstance(decision, Route) and [c.worker for c in decision.candidates] == ["c"]


def test_known_nowhere_uses_the_design_wording() -> None:
    decision = route("ghost:1b", [w("a", inventory=frozenset({"m:1b"}))])
    assert isinstance(decision, NoRoute)
    assert decision.message == 'model "ghost:1b" is not installed on any eligible worker'
