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
        # learned decode rate
        ([w("a", decode_rate=10.0), w("b", decode_rate=50.0)], "b"),
        # unknown speed is neutral: better than the slow one, worse than the fast one
        ([w("a", decode_rate=10.0), w("b"), w("c", decode_rate=50.0)], "c"),
        # one known value has nothing to compare with: a tie, broken by order
        ([w("a", decode_rate=10.0), w("b")], "a"),
        ([w("b"), w("a", decode_rate=10.0)], "b"),
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
    decision = route(M, [w("a", decode_rate=5.0), w("b"), w("c", decode_rate=50.0)])
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


# -- expected time: prefix, session, learned rates, the load guard -------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from turnout.core.routing import Demand, LoadGuard, Reason, credible_rate, expected_seconds, neutral_of  # noqa: E402

PROMPT = Demand(prompt_bytes=4000, output_tokens=16)


def ranked(decision: Route | NoRoute) -> list[str]:
    assert isinstance(decision, Route), decision
    return [c.worker for c in decision.candidates]


@pytest.mark.parametrize(
    ("workers", "order", "why"),
    [
        # the worker holding more of the prompt, at equal everything else
        ([w("a"), w("b", cached=3200)], ["b", "a"], "prefix 0.80"),
        ([w("a", cached=800), w("b", cached=3200), w("c")], ["b", "a", "c"], "prefix 0.80"),
        # ... by the client's session
        ([w("a"), w("b", cached=4000, by_session=True)], ["b", "a"], "session"),
        # nothing held anywhere: time alone
        ([w("a", prefill_rate=100.0), w("b", prefill_rate=1000.0)], ["b", "a"], "least expected time"),
        # a slow prefill rate can outweigh a small held prefix
        ([w("a", prefill_rate=50.0, cached=400), w("b", prefill_rate=2000.0)], ["b", "a"], "least expected time"),
        # held but busy: a one-slot engine running a long request is worse than a cold prefill elsewhere ...
        (
            [w("a", cached=3600, slots=1, in_flight=1, service_s=60.0), w("b", slots=1)],
            ["b", "a"],
            "least expected time",
        ),
        # ... and better when the request ahead is short
        ([w("a", cached=3600, slots=1, in_flight=1, service_s=0.2), w("b", slots=1)], ["a", "b"], "prefix 0.90"),
        # ... what is ahead is the expected work of the requests in flight there, when they were ranked
        (
            [w("a", cached=3600, slots=1, in_flight=1, ranked=1, backlog_s=0.2, service_s=60.0), w("b", slots=1)],
            ["a", "b"],
            "prefix 0.90",
        ),
        (
            [w("a", cached=3600, slots=1, in_flight=1, ranked=1, backlog_s=60.0, service_s=0.2), w("b", slots=1)],
            ["b", "a"],
            "least expected time",
        ),
        # a slot still free: no wait at all
        ([w("a", cached=3600, slots=2, in_flight=1, service_s=60.0), w("b", slots=2)], ["a", "b"], "prefix 0.90"),
        # the load guard: far more in flight than the least loaded one -> by load, whatever it holds. Unset, its
        # absolute threshold is the first worker's slots: a one-slot engine with two in flight (one waiting)
        # against an idle one ...
        (
            [w("a", cached=4000, in_flight=2, slots=1, service_s=0.1), w("b", in_flight=0, slots=1)],
            ["b", "a"],
            "load guard",
        ),
        # ... one in flight is not more than one slot's worth
        (
            [w("a", cached=4000, in_flight=1, slots=1, service_s=0.1), w("b", in_flight=0, slots=1)],
            ["a", "b"],
            "prefix 1.00",
        ),
        # ... an engine of 4 slots: more than 4 more
        (
            [w("a", cached=4000, in_flight=4, slots=4, service_s=0.1), w("b", in_flight=0, slots=4)],
            ["a", "b"],
            "prefix 1.00",
        ),
        (
            [w("a", cached=4000, in_flight=5, slots=4, service_s=0.1), w("b", in_flight=0, slots=4)],
            ["b", "a"],
            "load guard",
        ),
        # ... a batching engine (no slots): more than 32 more
        ([w("a", cached=4000, in_flight=32, service_s=0.1), w("b", in_flight=0)], ["a", "b"], "prefix 1.00"),
        ([w("a", cached=4000, in_flight=33, service_s=0.1), w("b", in_flight=0)], ["b", "a"], "load guard"),
        # ... both thresholds must be exceeded: 3 more, but not 1.5 times as many
        (
            [w("a", cached=4000, in_flight=10, slots=1, service_s=0.01), w("b", in_flight=7, slots=1)],
            ["a", "b"],
            "prefix 1.00",
        ),
    ],
)
def test_expected_time(workers: list[WorkerView], order: list[str], why: str) -> None:
    decision = route(M, workers, demand=PROMPT)
    assert ranked(decision) == order
    assert isinstance(decision, Route) and decision.why == why


def test_only_candidate() -> None:
    decision = route(M, [w("a", cached=400)], demand=PROMPT)
    assert isinstance(decision, Route) and decision.why == "only candidate" and decision.best.cached == 400


def test_a_worker_with_no_fresh_figure_is_tried_again() -> None:
    """No figure (never learned, or forgotten once stale) is the mean of the others: with one fast and one
    forgotten worker, the forgotten one ties with it and the rotation sends it its turn."""
    workers = [w("fast", prefill_rate=500.0, decode_rate=40.0, service_s=1.0), w("forgotten")]
    picks = {pick(route(M, workers, demand=PROMPT, rotation=r)) for r in range(4)}
    assert picks == {"fast", "forgotten"}


def test_a_rate_taught_by_one_answer_counts_less_than_one_taught_by_many() -> None:
    """One slow answer (it shared the CPUs with two others) must not starve a worker: its rate is drawn towards the
    candidates' mean, so a held prefix or a queue elsewhere still sends it requests. Many slow answers are
    believed."""
    # the slow-once worker holds the prompt's beginning; the others are idle and cold
    once = [w("slow", prefill_rate=40.0, prefill_samples=1, cached=2000), w("b", prefill_rate=120.0, prefill_samples=8)]
    assert pick(route(M, once, demand=PROMPT)) == "slow"
    often = [once[0]._replace(prefill_samples=20), once[1]]
    assert pick(route(M, often, demand=PROMPT)) == "b"


@pytest.mark.parametrize(
    ("rate", "samples", "mean", "expected"),
    [
        (None, 0, 100.0, 100.0),  # none learned: the mean
        (100.0, 1, 100.0, 100.0),  # at the mean: unchanged
        (100.0 / 3, 1, 100.0, 71.4),  # a third of the mean, once: 0.71 of it
        (100.0 / 3, 1000, 100.0, 33.4),  # ... a thousand times: believed
        (300.0, 1, 100.0, 115.4),  # faster, once: drawn down as much
    ],
)
def test_credible_rate(rate: float | None, samples: int, mean: float, expected: float) -> None:
    assert credible_rate(rate, samples, mean) == pytest.approx(expected, abs=0.05)


def test_the_load_guard_thresholds_are_configurable() -> None:
    workers = [w("a", cached=4000, in_flight=3), w("b")]
    assert ranked(route(M, workers, demand=PROMPT, guard=LoadGuard(absolute=3, relative=1.5))) == ["a", "b"]
    assert ranked(route(M, workers, demand=PROMPT, guard=LoadGuard(absolute=1, relative=1.5))) == ["b", "a"]


views = st.builds(
    WorkerView,
    name=st.just("x"),
    healthy=st.just(True),
    inventory=st.just(frozenset({M})),
    loaded=st.sampled_from([frozenset(), frozenset({M})]),
    in_flight=st.integers(0, 6),
    slots=st.one_of(st.none(), st.integers(1, 4)),
    prefill_rate=st.one_of(st.none(), st.floats(10, 5000)),
    decode_rate=st.one_of(st.none(), st.floats(1, 200)),
    service_s=st.one_of(st.none(), st.floats(0.01, 30)),
    backlog_s=st.floats(0, 100),
    busy_s=st.floats(0, 100),
    ranked=st.integers(0, 6),
    gpu_util=st.one_of(st.none(), st.floats(0, 1)),
    cached=st.integers(0, 4000),
    evicts=st.integers(0, 8000),
    evicts_age_s=st.floats(0, 10_000),
    history=st.integers(0, 8000),
    sharing=st.one_of(st.none(), st.floats(0, 2)),
    prefill_samples=st.integers(0, 50),
    decode_samples=st.integers(0, 50),
    vram_pressure=st.none(),
    rules=st.just(ALLOW),
    max_concurrent=st.none(),
    down_reason=st.none(),
    model_out=st.none(),
    by_session=st.just(False),
)


@given(st.lists(views, min_size=2, max_size=4), st.integers(0, 3), st.integers(0, 4000), st.integers(0, 8000))
@settings(max_examples=300, deadline=None)
def test_a_longer_held_prefix_never_scores_lower(pool: list[WorkerView], pick_: int, more: int, size: int) -> None:
    pool = [v._replace(name=f"w{i}") for i, v in enumerate(pool)]
    i = pick_ % len(pool)
    demand = Demand(prompt_bytes=size)
    longer = [v._replace(cached=v.cached + more) if n == i else v for n, v in enumerate(pool)]
    no_guard = LoadGuard(absolute=10**6, relative=10**6)
    before = route(M, pool, demand=demand, guard=no_guard)
    after = route(M, longer, demand=demand, guard=no_guard)
    assert isinstance(before, Route), before
    assert isinstance(after, Route), after
    score = {c.worker: c.score for c in before.candidates}
    score_after = {c.worker: c.score for c in after.candidates}
    assert score_after[f"w{i}"] >= score[f"w{i}"]
    assert ranked(after).index(f"w{i}") <= ranked(before).index(f"w{i}")
    # the other workers' scores are not touched by it
    assert all(score_after[k] == score[k] for k in score if k != f"w{i}")


def test_reasons_are_the_documented_words() -> None:
    assert [r.value for r in Reason] == [
        "prefix",
        "session",
        "history",
        "load guard",
        "free slot",
        "least expected time",
        "only candidate",
    ]


def test_a_group_held_nowhere_goes_back_to_where_it_was() -> None:
    """One-slot engines, each slot taken by another group's prompt since: the engine this group was on before
    goes first, unless it is expected to take more than a quarter longer."""
    workers = [w("a", slots=1, evicts=4000), w("b", slots=1, evicts=4000, history=2000), w("c", slots=1, evicts=4000)]
    decision = route(M, workers, demand=PROMPT)
    assert ranked(decision) == ["b", "a", "c"]
    assert isinstance(decision, Route) and decision.why == "history 0.50"
    # ... the most of it first
    workers[0] = workers[0]._replace(history=3000)
    assert ranked(route(M, workers, demand=PROMPT))[0] == "a"
    # ... but not when it is far slower
    slow = [
        w("a", slots=1, prefill_rate=100.0, prefill_samples=9),
        w("b", slots=1, prefill_rate=40.0, prefill_samples=9, history=4000),
    ]
    decision = route(M, slow, demand=PROMPT)
    assert ranked(decision) == ["a", "b"] and isinstance(decision, Route) and decision.why == "least expected time"
    # ... and never over a worker that holds some of it
    held = [w("a", slots=1, cached=800), w("b", slots=1, history=4000)]
    assert ranked(route(M, held, demand=PROMPT))[0] == "a"
    # ... while holding a little of it too never ranks the one it was sent lower (it did: a block held, and the
    # quicker worker went first by least expected time; hypothesis found it, test_a_longer_held_prefix_never_...)
    for cached, why in ((0, "history 1.00"), (256, "history 1.00"), (1024, "prefix 0.26")):
        sent = [w("a", slots=1, history=4000, prefill_rate=90.0, prefill_samples=9, cached=cached)]
        sent.append(w("b", slots=1, prefill_rate=100.0, prefill_samples=9))
        decision = route(M, sent, demand=PROMPT)
        assert ranked(decision) == ["a", "b"] and isinstance(decision, Route) and decision.why == why, cached
    # ... and not where another worker holds part of it (a sibling conversation's system prompt, on an engine busy
    # now): the expected time decides, as sending it back within the slack pushes out a prompt still held there for
    # nothing (with it, the prefix bench's spread reused 39 % against 47 %)
    sibling = [
        w("a", slots=1, history=4000, prefill_rate=90.0, prefill_samples=9),
        w("b", slots=1, cached=800, in_flight=1, prefill_rate=100.0, prefill_samples=9),
        w("c", slots=1, prefill_rate=100.0, prefill_samples=9),
    ]
    decision = route(M, sibling, demand=PROMPT)
    assert ranked(decision) == ["c", "a", "b"] and isinstance(decision, Route), decision
    assert decision.why == "least expected time"


def test_a_new_conversation_goes_where_it_pushes_nothing_out() -> None:
    """One-slot engines: the one holding another conversation's prompt costs that prompt's prefill again later."""
    workers = [w("busy", slots=1, evicts=4000), w("free", slots=1)]
    decision = route(M, workers, demand=PROMPT)
    assert ranked(decision) == ["free", "busy"]
    # ... unless what it holds is this conversation's own beginning
    workers = [w("same", slots=1, evicts=4000, cached=3600), w("free", slots=1)]
    assert ranked(route(M, workers, demand=PROMPT)) == ["same", "free"]
    # every slot taken: the one whose prompt was sent longest ago goes (least likely to come back soon)
    workers = [w("recent", slots=1, evicts=4000, evicts_age_s=2.0), w("old", slots=1, evicts=4000, evicts_age_s=90.0)]
    assert ranked(route(M, workers, demand=PROMPT)) == ["old", "recent"]


# -- work-conserving: an engine with a free slot is never passed over for one with a queue unless the expected time,
# the wait in that queue included, says so ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("workers", "order", "why"),
    [
        # a one-slot engine holds the prompt but runs another request; the idle one takes it ...
        (
            [w("a", cached=3600, slots=1, in_flight=1, ranked=1, backlog_s=5.0), w("b", slots=1)],
            ["b", "a"],
            "least expected time",
        ),
        # ... unless that request is nearly done: the wait shrinks as the slot works through it
        (
            [w("a", cached=3600, slots=1, in_flight=1, ranked=1, backlog_s=5.0, busy_s=4.5), w("b", slots=1)],
            ["a", "b"],
            "prefix 0.90",
        ),
        # ... but never below a share of it (an answer running longer than expected has some left)
        (
            [w("a", cached=3600, slots=1, in_flight=1, ranked=1, backlog_s=30.0, busy_s=60.0), w("b", slots=1)],
            ["b", "a"],
            "least expected time",
        ),
        # the cost of pushing another conversation's prompt out of the idle engine's slot does not keep it idle
        # while this request would queue elsewhere ...
        (
            [
                w("a", slots=1, in_flight=1, ranked=1, backlog_s=1.0),
                w("b", slots=1, evicts=40_000, evicts_age_s=0.0),
            ],
            ["b", "a"],
            "free slot",
        ),
        # ... it still decides between engines that both have a free slot
        (
            [w("a", slots=1, evicts=40_000, evicts_age_s=0.0), w("b", slots=1)],
            ["b", "a"],
            "least expected time",
        ),
        # a batching engine of unknown capacity never queues (its wait is spread over SOFT_SLOTS)
        ([w("a", cached=3600, in_flight=3, ranked=3, backlog_s=3.0), w("b")], ["a", "b"], "prefix 0.90"),
    ],
)
def test_work_conserving(workers: list[WorkerView], order: list[str], why: str) -> None:
    decision = route(M, workers, demand=PROMPT)
    assert ranked(decision) == order
    assert isinstance(decision, Route) and decision.why == why


def test_history_only_picks_among_free_engines_when_one_is_free() -> None:
    """A conversation group's old engine is busy: the group goes to the free one, not into a queue."""
    workers = [w("old", slots=1, in_flight=1, ranked=1, backlog_s=0.5, history=4000), w("free", slots=1)]
    decision = route(M, workers, demand=PROMPT)
    assert ranked(decision)[0] == "free"


@given(st.lists(views, min_size=2, max_size=5), st.integers(0, 8000), st.integers(0, 7))
@settings(max_examples=500, deadline=None)
def test_a_queued_engine_goes_first_only_when_it_is_expected_sooner(
    pool: list[WorkerView], size: int, rotation: int
) -> None:
    pool = [v._replace(name=f"w{i}") for i, v in enumerate(pool)]
    demand = Demand(prompt_bytes=size)
    no_guard = LoadGuard(absolute=10**6, relative=10**6)
    decision = route(M, pool, demand=demand, guard=no_guard, rotation=rotation)
    assert isinstance(decision, Route)
    neutral = neutral_of(pool)
    expected = {v.name: expected_seconds(v, M, demand, neutral) for v in pool}
    first = expected[decision.best.worker]
    if first.queued and decision.reason is not Reason.HISTORY:
        assert all(e.own > first.own for e in expected.values() if not e.queued), (decision, expected)
    if decision.reason is Reason.HISTORY and any(not e.queued for e in expected.values()):
        assert not first.queued


@pytest.mark.parametrize(
    ("workers", "reason", "fragment"),
    [
        # a worker whose inventory was never fetched is unknown, not empty: down, it may hold the model (after a
        # gateway restart with the box switched off): 503, naming it, never "not installed"
        (
            [w("box", healthy=False, inventory=None, down_reason="connection refused"), w("b", inventory=frozenset())],
            NoRouteReason.NO_HEALTHY,
            'model "llama3:8b" is not installed on any healthy worker, and box is down with models not known yet '
            "(never listed): box: connection refused",
        ),
        (
            [
                w("x", healthy=False, inventory=None, down_reason="timeout"),
                w("y", healthy=False, inventory=None),
                w("b", inventory=frozenset()),
            ],
            NoRouteReason.NO_HEALTHY,
            "x and y are down with models not known yet (never listed): x: timeout; y: not answering",
        ),
        # ... unless its placement could never serve it there
        (
            [w("box", healthy=False, inventory=None, rules=DENY_M), w("b", inventory=frozenset())],
            NoRouteReason.NOT_INSTALLED,
            "not installed on any eligible worker",
        ),
        # ... and a known holder that is down is named as before
        (
            [
                w("box", healthy=False, down_reason="timeout"),
                w("c", healthy=False, inventory=None),
                w("b", inventory=frozenset()),
            ],
            NoRouteReason.NO_HEALTHY,
            'model "llama3:8b" is installed only on box, which is down (timeout)',
        ),
    ],
)
def test_a_down_worker_never_listed_may_hold_the_model(
    workers: list[WorkerView], reason: NoRouteReason, fragment: str
) -> None:
    decision = route(M, workers)
    assert isinstance(decision, NoRoute), decision
    assert decision.reason is reason
    assert fragment in decision.message, decision.message


def test_no_workers_for_a_model_the_gateway_serves_elsewhere_is_an_unknown_model() -> None:
    """Only claims and endpoints (none of them this model's): an unknown model (404), never "no workers"."""
    decision = route(M, [], served_elsewhere=True)
    assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.UNKNOWN_MODEL
    assert M in decision.message
    assert route(M, [], served_elsewhere=False).reason is NoRouteReason.NO_WORKERS  # type: ignore[union-attr]


def test_the_one_free_worker_of_several_is_given_the_work_it_takes() -> None:
    """A batch request that only one worker has a slot for (the others full: their max_concurrent) still records the
    work it takes there: its backlog ranks the next requests. With 0 the next interactive request expected that
    engine to be free at once and queued there behind it (bench/batch_fleet.py)."""
    one = w("a", prefill_rate=100.0, decode_rate=40.0, slots=1, loaded=frozenset({M}))
    full = [w("b", in_flight=1, max_concurrent=1), w("c", in_flight=1, max_concurrent=1)]
    decision = route(M, [one, *full], demand=PROMPT)
    assert isinstance(decision, Route) and decision.best.worker == "a"
    assert decision.best.work == pytest.approx(1000 / 100.0 + 16 / 40.0)  # 4000 bytes: 1000 tokens
    alone = route(M, [one], demand=PROMPT)  # one worker for the model: nothing compares it, nothing is estimated
    assert isinstance(alone, Route) and alone.best.work == 0.0
