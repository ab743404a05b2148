"""The placement matrix, the router and discovery decide with one function: checked on every cell of
generated fleets (rules with and without tags, prefixes, overrides, known and unknown inventories)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.admin.api import placement_matrix
from turnout.config import load_settings
from turnout.core.placement import ConfigRuleError, PlacementRules, toggle_rule
from turnout.core.routing import NoRoute, NoRouteReason, Route, route
from turnout.fleet.state import Fleet
from turnout.gateway.catalog import ollama_tags
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
fleets = st.lists(st.tuples(rulesets, inventories, st.booleans()), min_size=1, max_size=4)


def build(spec: list[tuple[PlacementRules, frozenset[str] | None, bool]], root: Path) -> Fleet:
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
    for i, (rules, inventory, override) in enumerate(spec):
        state = fleet.workers[f"w{i}"]
        state.healthy = True
        state.inventory = inventory
        state.tags = {n: {"name": n} for n in inventory or ()}
        if override:
            store.put(state.name, rules)
        else:
            state.baseline = rules
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
def test_every_cell_agrees_with_the_router(spec: list[tuple[PlacementRules, frozenset[str] | None, bool]]) -> None:
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


@settings(max_examples=60, deadline=None)
@given(fleets, st.data())
def test_a_toggle_flips_the_cell_and_the_route(
    spec: list[tuple[PlacementRules, frozenset[str] | None, bool]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = build(spec, Path(tmp))
        matrix = placement_matrix(fleet)
        model = data.draw(st.sampled_from(matrix["models"] or ["gemma4"]))
        worker = data.draw(st.sampled_from(sorted(fleet.workers)))
        before = next(r for r in matrix["workers"] if r["name"] == worker)["cells"].get(model)
        rules, source = fleet.rules(worker)
        baseline = fleet.workers[worker].baseline if source == "override" else rules  # as the API does
        try:
            toggled = toggle_rule(rules, model, baseline=baseline)
        except ConfigRuleError:  # only a cell decided by an exact config deny
            assert before is not None and before["exact"] and not before["allowed"] and before["origin"] == "config"
            return
        fleet.placement.put(worker, toggled)
        after = next(r for r in placement_matrix(fleet)["workers"] if r["name"] == worker)["cells"].get(model)
        if before is not None and after is not None and not (before["exact"] and before["origin"] == "ui"):
            assert after["allowed"] is not before["allowed"]  # a new exception flips the verdict
            assert after["exact"] and after["origin"] == "ui"
            # and the second click removes exactly that exception
            assert (
                toggle_rule(toggled, model, baseline=fleet.workers[worker].baseline if source == "override" else rules)
                == rules
            )
        check_cells(fleet)


def test_tagless_rule_is_one_row_and_blocks_what_it_shows() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rules = PlacementRules.parse("allow_all", [], ["gemma4"])
        fleet = build([(rules, frozenset({"gemma4:latest"}), True)], Path(tmp))
        matrix = placement_matrix(fleet)
        assert matrix["models"] == ["gemma4:latest"]
        assert matrix["workers"][0]["cells"]["gemma4:latest"]["allowed"] is False
        decision = route("gemma4", fleet.views("gemma4"))
        assert isinstance(decision, NoRoute) and decision.reason is NoRouteReason.BLOCKED
        assert ollama_tags(fleet)["models"] == []
