"""The placement matrix, the router and discovery decide with one function: checked on every cell of
generated fleets (rules with and without tags, prefixes, config baselines with and without overrides, known and
unknown inventories), and every click on any cell flips what the matrix shows and what the router does."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.admin.api import placement_matrix
from turnout.config import Worker, load_settings
from turnout.core.patterns import parse_pattern
from turnout.core.placement import PlacementRules, toggle_rule
from turnout.core.routing import NoRoute, NoRouteReason, Route, route
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.catalog import ollama_tags, openai_models
from turnout.state.placement_store import PlacementStore

BASES = ["gemma4", "qwen3", "org/m"]
NAMES = [*BASES, *(f"{b}:{t}" for b in BASES for t in ("latest", "2b"))]
PATTERNS = [*NAMES, "gemma4:*", "gemma*", "*", "org/*", "qwen3:l*"]

rulesets = st.builds(
    lambda mode, allowed, denied: PlacementRules.parse(mode, allowed, denied),
    st.sampled_from(["allow_all", "whitelist"]),
    st.lists(st.sampled_from(PATTERNS), max_size=3),
    st.lists(st.sampled_from(PATTERNS), max_size=3),
)
# Ollama lists tagged names; OpenAI-style workers list whatever ids they serve
inventories = st.one_of(st.none(), st.frozensets(st.sampled_from(NAMES), max_size=4))
# per worker: its config baseline, its override (None: none), its inventory
fleets = st.lists(st.tuples(rulesets, st.one_of(st.none(), rulesets), inventories), min_size=1, max_size=4)
Spec = list[tuple[PlacementRules, PlacementRules | None, frozenset[str] | None]]


def build(spec: Spec, root: Path) -> Fleet:
    config = {
        "storage": {"data_dir": str(root)},
        "workers": [{"name": f"w{i}", "url": f"http://127.0.0.1:{9000 + i}"} for i in range(len(spec))],
    }
    path = root / "config.json"
    path.write_text(json.dumps(config))
    settings_ = load_settings(path, env={})
    store = PlacementStore(root / "model-placement.json")
    store.load()
    fleet = Fleet(settings_, store)
    for i, (baseline, override, inventory) in enumerate(spec):
        state = fleet.workers[f"w{i}"]
        state.healthy = True
        state.inventory = inventory
        state.tags = {n: {"name": n} for n in inventory or ()}
        state.baseline = baseline
        if override is not None:
            store.put(state.name, override)
    return fleet


def alone(fleet: Fleet, model: str, worker: str) -> Route | NoRoute:
    return route(model, [v for v in fleet.views(model) if v.name == worker])


def check_cells(fleet: Fleet) -> None:
    matrix = placement_matrix(fleet)
    for row in matrix["workers"]:
        for model, cell in row["cells"].items():
            decision = alone(fleet, model, row["name"])
            where = (row["name"], model, cell, decision)
            if not cell["allowed"]:
                assert isinstance(decision, NoRoute), where
                # known nowhere outranks blocked in the router's wording; either way it does not route
                expected = {NoRouteReason.BLOCKED, NoRouteReason.UNKNOWN_MODEL}
                assert decision.reason in (expected if cell["installed"] is False else {NoRouteReason.BLOCKED}), where
            elif cell["installed"] is False:
                assert isinstance(decision, NoRoute), where
                assert decision.reason in (NoRouteReason.NOT_INSTALLED, NoRouteReason.UNKNOWN_MODEL), where
            else:  # installed, or inventory unknown (fails open)
                assert isinstance(decision, Route) and decision.best.worker == row["name"], where


@settings(max_examples=150, deadline=None)
@given(fleets)
def test_every_cell_agrees_with_the_router(spec: Spec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = build(spec, Path(tmp))
        check_cells(fleet)
        # every spelling of a row routes like the row: "gemma4" and "gemma4:latest" are one model
        for name in NAMES:
            for worker in fleet.workers:
                a, b = alone(fleet, name, worker), alone(fleet, name.removesuffix(":latest"), worker)
                assert type(a) is type(b) and getattr(a, "reason", None) == getattr(b, "reason", None), (name, a, b)
        # discovery lists only what routes, and the router only picks workers whose cell allows it
        for entry in ollama_tags(fleet)["models"]:
            decision = route(entry["name"], fleet.views(entry["name"]))
            assert isinstance(decision, Route), (entry, decision)
        matrix = {row["name"]: row["cells"] for row in placement_matrix(fleet)["workers"]}
        for model in placement_matrix(fleet)["models"]:
            decision = route(model, fleet.views(model))
            if isinstance(decision, Route):
                for candidate in decision.candidates:
                    cell = matrix[candidate.worker][model]
                    assert cell["allowed"] and cell["installed"] is not False, (model, candidate, cell)


def cell(fleet: Fleet, worker: str, model: str) -> dict[str, object] | None:
    return next(r for r in placement_matrix(fleet)["workers"] if r["name"] == worker)["cells"].get(model)


def exact(rules: PlacementRules, model: str) -> tuple[bool, bool]:
    """Whether ``rules`` hold an exact allow and an exact deny for ``model`` (any spelling)."""
    name = parse_pattern(model).prefix
    return (
        any(p.exact and p.prefix == name for p in rules.allowed),
        any(p.exact and p.prefix == name for p in rules.denied),
    )


@settings(max_examples=80, deadline=None)
@given(fleets, st.data())
def test_a_toggle_flips_the_cell_and_the_route(spec: Spec, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = build(spec, Path(tmp))
        model = data.draw(st.sampled_from(placement_matrix(fleet)["models"] or NAMES))
        worker = data.draw(st.sampled_from(sorted(fleet.workers)))
        baseline = fleet.workers[worker].baseline
        before = cell(fleet, worker, model)
        rules, source = fleet.rules(worker)
        # a UI exception: exact rules for the model other than the config's (the design: a click removes it)
        exception = exact(rules, model) not in ((False, False), exact(baseline, model))
        toggled = toggle_rule(rules, model, baseline=baseline)  # as the API does
        fleet.placement.put(worker, toggled)
        after = cell(fleet, worker, model)
        if exception:
            assert exact(toggled, model) == exact(baseline, model), (rules, toggled)
        elif before is not None and after is not None:
            # every other cell can be clicked, whatever decides it (an exact config rule too), and the click flips it
            assert after["allowed"] is not before["allowed"], (before, after)
            assert after["source"] == "override"
        check_cells(fleet)
        if exception:
            return
        # the second click flips it back; on a worker without an override before, it restores the rules exactly
        again = toggle_rule(toggled, model, baseline=baseline)
        fleet.placement.put(worker, again)
        if before is not None and (last := cell(fleet, worker, model)) is not None:
            assert last["allowed"] is before["allowed"]
        if source == "config":
            assert again == rules == baseline
        check_cells(fleet)


def test_tagless_rule_is_one_row_and_blocks_what_it_shows() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rules = PlacementRules.parse("allow_all", [], ["gemma4"])
        fleet = build([(PlacementRules(), rules, frozenset({"gemma4:latest"}))], Path(tmp))
        matrix = placement_matrix(fleet)
        assert matrix["models"] == ["gemma4:latest"]
        assert matrix["workers"][0]["cells"]["gemma4:latest"]["allowed"] is False
        decision = route("gemma4", fleet.views("gemma4"))
        assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.BLOCKED
        assert ollama_tags(fleet)["models"] == []


def test_a_claimed_model_blocked_on_its_engine_is_not_listed() -> None:
    """A claim's engine is a column of the matrix while it serves: a block there blocks it (the router asks only
    that column) and hides it from discovery, though claimed models are otherwise listed whatever their phase."""
    with tempfile.TemporaryDirectory() as tmp:
        fleet = build([(PlacementRules(), None, frozenset({"gemma4:latest"}))], Path(tmp))
        engine = WorkerState(
            Worker.model_validate({"name": "claim-qwen", "url": "http://127.0.0.1:9100", "type": "openai"}),
            claim="qwen",
        )  # as the claim bindings make it (turnout.fleet.claims)
        engine.healthy = True
        engine.inventory = engine.loaded = frozenset({"qwen3:8b"})
        engine.tags = {"qwen3:8b": {"id": "qwen3:8b", "object": "model"}}
        fleet.workers[engine.name] = engine
        fleet.bindings["qwen3:8b"] = engine
        fleet.claim_listing = {"qwen3:8b": {"id": "qwen3:8b", "object": "model", "owned_by": "claim/qwen"}}
        assert "qwen3:8b" in {m["name"] for m in ollama_tags(fleet)["models"]}
        fleet.placement.put(engine.name, PlacementRules.parse("allow_all", [], ["qwen3:8b"]))
        row = next(r for r in placement_matrix(fleet)["workers"] if r["name"] == engine.name)
        assert row["cells"]["qwen3:8b"]["allowed"] is False
        decision = route("qwen3:8b", fleet.views("qwen3:8b"))
        assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.BLOCKED
        assert "qwen3:8b" not in {m["name"] for m in ollama_tags(fleet)["models"]}
        assert "qwen3:8b" not in {m["id"] for m in openai_models(fleet)["data"]}
