import pytest

from turnout.core.patterns import parse_pattern
from turnout.core.placement import (
    PlacementRules,
    RuleOrigin,
    decide,
    exact_rules,
    mode_origin,
    resolve_placement,
    rule_origin,
    toggle_rule,
)

SEED = PlacementRules.parse("allow_all", ["gemma4:latest"], ["gemma4:*"])


def rules(mode: str, allowed: list[str] = [], denied: list[str] = []) -> PlacementRules:  # noqa: B006
    return PlacementRules.parse(mode, allowed, denied)


@pytest.mark.parametrize(
    ("ruleset", "model", "allowed", "rule", "exact"),
    [
        # the seed example
        (SEED, "gemma4:latest", True, "gemma4:latest", True),
        (SEED, "gemma4:2b", False, "gemma4:*", False),
        (SEED, "qwen3:8b", True, "mode", False),
        # modes
        (rules("allow_all"), "x", True, "mode", False),
        (rules("whitelist"), "x", False, "mode", False),
        # whitelist with prefixes from the issue config
        (rules("whitelist", ["model-a:*", "model-b:*"]), "model-a:7b", True, "model-a:*", False),
        (rules("whitelist", ["model-a:*", "model-b:*"]), "model-b:latest", True, "model-b:*", False),
        (rules("whitelist", ["model-a:*", "model-b:*"]), "model-c:7b", False, "mode", False),
        # deny wins at equal specificity
        (rules("allow_all", ["gemma4:*"], ["gemma4:*"]), "gemma4:2b", False, "gemma4:*", False),
        (rules("whitelist", ["qwen3:8b"], ["qwen3:8b"]), "qwen3:8b", False, "qwen3:8b", True),
        (rules("allow_all", ["*"], ["*"]), "x", False, "*", False),
        # longest prefix wins regardless of kind
        (rules("allow_all", ["orcarouter/big*"], ["orcarouter/*"]), "orcarouter/big-1", True, "orcarouter/big*", False),
        (
            rules("allow_all", ["orcarouter/*"], ["orcarouter/big*"]),
            "orcarouter/big-1",
            False,
            "orcarouter/big*",
            False,
        ),
        (rules("allow_all", ["orcarouter/*"], ["orcarouter/big*"]), "orcarouter/small", True, "orcarouter/*", False),
        # exact beats any prefix, either way round
        (rules("whitelist", ["qwen3:8b"], ["qwen3:*"]), "qwen3:8b", True, "qwen3:8b", True),
        (rules("allow_all", ["qwen3:*"], ["qwen3:8b"]), "qwen3:8b", False, "qwen3:8b", True),
        (rules("allow_all", ["qwen3:*"], ["qwen3:8b"]), "qwen3:4b", True, "qwen3:*", False),
        # '*' is the least specific prefix
        (rules("whitelist", ["*"], ["llama*"]), "llama3", False, "llama*", False),
        (rules("whitelist", ["*"], ["llama*"]), "qwen", True, "*", False),
        (rules("allow_all", [], ["*"]), "anything", False, "*", False),
        (rules("whitelist", ["llama*"], ["*"]), "llama3", True, "llama*", False),
        # a tagless rule means Ollama's implicit :latest, in either direction (core.names)
        (rules("whitelist", ["gemma4"]), "gemma4:latest", True, "gemma4", True),
        (rules("allow_all", [], ["gemma4:latest"]), "gemma4", False, "gemma4:latest", True),
        (rules("whitelist", ["gemma4"]), "gemma4:2b", False, "mode", False),
        (rules("whitelist", ["gemma4:*"]), "gemma4", True, "gemma4:*", False),
        (rules("whitelist", ["gemma4:latest"]), "gemma4:latest", True, "gemma4:latest", True),
    ],
)
def test_resolve(ruleset: PlacementRules, model: str, allowed: bool, rule: str, exact: bool) -> None:
    verdict = resolve_placement(ruleset, model)
    assert (verdict.allowed, verdict.rule, verdict.exact) == (allowed, rule, exact)


@pytest.mark.parametrize(
    ("before", "model", "after_allowed", "after_denied", "verdict"),
    [
        # no exact rule: add one opposite to the current verdict
        (rules("allow_all"), "x", [], ["x"], False),
        (rules("whitelist"), "x", ["x"], [], True),
        (SEED, "gemma4:2b", ["gemma4:latest", "gemma4:2b"], ["gemma4:*"], True),
        # an exact rule exists: remove it, the broader rule decides again
        (SEED, "gemma4:latest", [], ["gemma4:*"], False),
        (rules("whitelist", ["x"]), "x", [], [], False),
        (rules("allow_all", [], ["x", "y"]), "x", [], ["y"], True),
        # an exact rule that says what the mode says: removed all the same (the cell keeps its verdict)
        (rules("allow_all", ["x"]), "x", [], [], True),
        (rules("whitelist", [], ["x"]), "x", [], [], False),
    ],
)
def test_toggle(
    before: PlacementRules, model: str, after_allowed: list[str], after_denied: list[str], verdict: bool
) -> None:
    after = toggle_rule(before, model)
    assert [p.text for p in after.allowed] == after_allowed
    assert [p.text for p in after.denied] == after_denied
    assert after.mode is before.mode
    assert resolve_placement(after, model).allowed is verdict


def test_toggle_twice_restores() -> None:
    assert toggle_rule(toggle_rule(SEED, "gemma4:2b"), "gemma4:2b") == SEED


# toggle with the config baseline known: (baseline, override or None, model, allowed after, denied after, verdict)
@pytest.mark.parametrize(
    ("baseline", "override", "model", "after_allowed", "after_denied", "verdict"),
    [
        # a cell decided by an exact config allow: the opposite exact rule replaces it in the override
        (SEED, None, "gemma4:latest", [], ["gemma4:*", "gemma4:latest"], False),
        # ... and the second click removes that exception and puts the config rule back
        (
            SEED,
            rules("allow_all", [], ["gemma4:*", "gemma4:latest"]),
            "gemma4:latest",
            ["gemma4:latest"],
            ["gemma4:*"],
            True,
        ),
        # the same rule in another spelling is the same UI exception
        (SEED, rules("allow_all", [], ["gemma4:*", "gemma4"]), "gemma4:latest", ["gemma4:latest"], ["gemma4:*"], True),
        # an exception written beside a config rule (as older versions did): both go, the config rule comes back
        (
            SEED,
            rules("allow_all", ["gemma4:latest"], ["gemma4:*", "gemma4:latest"]),
            "gemma4:latest",
            ["gemma4:latest"],
            ["gemma4:*"],
            True,
        ),
        (rules("allow_all", ["x"]), rules("allow_all", ["x"], ["x"]), "x", ["x"], [], True),
        # a cell decided by an exact config deny: outvoted by the override, and back on the second click
        (rules("allow_all", [], ["x"]), None, "x", ["x"], [], True),
        (rules("allow_all", [], ["x"]), rules("allow_all", ["x"], []), "x", [], ["x"], False),
        (
            rules("allow_all", [], ["y", "x", "z"]),
            rules("allow_all", ["x:latest"], ["y", "z"]),
            "x",
            [],
            ["y", "x", "z"],
            False,
        ),
        # a baseline that both allows and denies exactly: one click allows, the next brings both back
        (rules("allow_all", ["x"], ["x"]), None, "x", ["x"], [], True),
        (rules("allow_all", ["x"], ["x"]), rules("allow_all", ["x"], []), "x", ["x"], ["x"], False),
        # a prefix-decided cell: an exception is added, and removed again
        (SEED, None, "gemma4:2b", ["gemma4:latest", "gemma4:2b"], ["gemma4:*"], True),
        (
            SEED,
            rules("allow_all", ["gemma4:latest", "gemma4:2b"], ["gemma4:*"]),
            "gemma4:2b",
            ["gemma4:latest"],
            ["gemma4:*"],
            False,
        ),
        # mode-decided cells on a whitelist / allow_all baseline
        (rules("whitelist"), None, "x", ["x"], [], True),
        (rules("whitelist"), rules("whitelist", ["x"]), "x", [], [], False),
        (rules("allow_all"), rules("allow_all", [], ["x"]), "x", [], [], True),
        # an override whose mode differs from the baseline: exceptions still follow the override's rules
        (rules("allow_all"), rules("whitelist"), "x", ["x"], [], True),
        # a config prefix rule the override also has is never touched
        (rules("whitelist", ["q:*"]), rules("whitelist", ["q:*"], ["q:1"]), "q:1", ["q:*"], [], True),
        # an override that dropped the config's exact rule (a PUT): removing the exception brings it back
        (rules("allow_all", [], ["x"]), rules("whitelist", ["x"]), "x", [], ["x"], False),
    ],
)
def test_toggle_knows_the_baseline(
    baseline: PlacementRules,
    override: PlacementRules | None,
    model: str,
    after_allowed: list[str],
    after_denied: list[str],
    verdict: bool,
) -> None:
    source = override or baseline
    after = toggle_rule(source, model, baseline=baseline)
    assert [p.text for p in after.allowed] == after_allowed
    assert [p.text for p in after.denied] == after_denied
    assert resolve_placement(after, model).allowed is verdict is not resolve_placement(source, model).allowed
    # prefix rules and the mode are never touched
    assert [p for p in after.allowed if not p.exact] == [p for p in source.allowed if not p.exact]
    assert [p for p in after.denied if not p.exact] == [p for p in source.denied if not p.exact]
    assert after.mode is source.mode


# A click on a UI exception removes it, also where the cell then keeps its verdict (an exception that says what
# the other rules say): (baseline, override, model, allowed after, denied after, verdict before and after)
@pytest.mark.parametrize(
    ("baseline", "override", "model", "after_allowed", "after_denied", "verdict"),
    [
        # an exact allow made through the API on an allow_all worker (it agrees with the mode)
        (rules("allow_all"), rules("allow_all", ["x"]), "x", [], [], True),
        (rules("allow_all"), rules("allow_all", ["x:latest"]), "x", [], [], True),
        (rules("allow_all"), rules("allow_all", ["x"]), "x:latest", [], [], True),
        # an exact deny on a whitelist worker
        (rules("whitelist"), rules("whitelist", [], ["x"]), "x", [], [], False),
        # an exact allow that agrees with a config prefix allow, and a deny with a config prefix deny
        (rules("whitelist", ["q:*"]), rules("whitelist", ["q:*", "q:1"]), "q:1", ["q:*"], [], True),
        (
            SEED,
            rules("allow_all", ["gemma4:latest"], ["gemma4:*", "gemma4:2b"]),
            "gemma4:2b",
            ["gemma4:latest"],
            ["gemma4:*"],
            False,
        ),
        # an exact allow beside the config's exact deny (the deny decides): the config's rule alone again
        (rules("allow_all", [], ["x"]), rules("allow_all", ["x"], ["x", "y"]), "x", [], ["x", "y"], False),
        # the config's exact allow written twice in the override in other spellings is no exception: it flips
        (rules("allow_all", ["x"]), rules("allow_all", ["x", "x:latest"]), "x", [], ["x"], False),
    ],
)
def test_a_click_on_a_ui_exception_removes_it_whatever_the_verdict(
    baseline: PlacementRules,
    override: PlacementRules,
    model: str,
    after_allowed: list[str],
    after_denied: list[str],
    verdict: bool,
) -> None:
    before = decide(override, model, baseline)
    after = toggle_rule(override, model, baseline=baseline)
    assert [p.text for p in after.allowed] == after_allowed
    assert [p.text for p in after.denied] == after_denied
    assert resolve_placement(after, model).allowed is verdict
    if before.exact and before.origin is RuleOrigin.UI:  # removed: the cell says what the config file decides
        assert before.allowed is verdict
        assert decide(after, model, baseline).origin is RuleOrigin.CONFIG
        name = parse_pattern(model).prefix
        for denied, patterns in ((False, after.allowed), (True, after.denied)):
            for p in patterns:
                if p.exact and p.prefix == name:  # what is left for the model is the config's, nothing of the UI's
                    assert rule_origin(after, baseline, p, denied=denied) is RuleOrigin.CONFIG
    else:
        assert before.allowed is not verdict


@pytest.mark.parametrize("model", ["x", "x:latest"])
def test_a_click_outvotes_an_exact_config_deny_and_the_next_restores_it(model: str) -> None:
    baseline = rules("allow_all", [], ["x"])
    once = toggle_rule(baseline, model, baseline=baseline)
    assert decide(once, model, baseline) == decide(once, "x:latest", baseline)
    first = decide(once, model, baseline)
    assert (first.allowed, first.exact, first.origin) == (True, True, RuleOrigin.UI)
    twice = toggle_rule(once, model, baseline=baseline)
    assert twice == baseline
    second = decide(twice, model, baseline)
    assert (second.allowed, second.rule, second.origin) == (False, "x", RuleOrigin.CONFIG)
    # without a baseline (every exact rule an exception) the exact deny is removed
    assert toggle_rule(baseline, model).denied == ()


def test_two_clicks_undo_each_other_where_the_override_dropped_the_configs_exact_rules() -> None:
    """A config that names gemma4 both allowed and denied (the deny decides), an override without either: the
    first click puts the config's rules back (blocked), the second flips it (allowed). Before, the first click
    wrote an exact deny, the second took it for a UI exception and put the config's rules back: still blocked
    (tests/admin/test_matrix_agrees.py's property found it)."""
    baseline = rules("allow_all", ["gemma4"], ["gemma4"])
    dropped = rules("allow_all")
    once = toggle_rule(dropped, "gemma4", baseline=baseline)
    assert once == baseline and not resolve_placement(once, "gemma4").allowed
    twice = toggle_rule(once, "gemma4", baseline=baseline)
    assert resolve_placement(twice, "gemma4").allowed
    # where the config's rules would not flip it, the opposite exact rule is written, as on any cell
    agrees = rules("allow_all", ["gemma4"])
    assert toggle_rule(dropped, "gemma4", baseline=agrees).denied == rules("allow_all", [], ["gemma4"]).denied


def test_toggle_twice_with_baseline_restores() -> None:
    baselines = [SEED, rules("whitelist", ["a", "b:*"], ["b:1", "c"]), rules("allow_all", ["x"], ["x", "y*"])]
    for baseline in baselines:
        for model in ("gemma4:latest", "gemma4:2b", "qwen3:8b", "gemma4", "a", "b:1", "b:2", "c", "x", "y1"):
            once = toggle_rule(baseline, model, baseline=baseline)
            assert resolve_placement(once, model).allowed is not resolve_placement(baseline, model).allowed
            assert toggle_rule(once, model, baseline=baseline) == baseline, (baseline, model)


@pytest.mark.parametrize(
    ("rules_", "baseline", "pattern", "denied", "origin"),
    [
        (SEED, None, "x", False, RuleOrigin.CONFIG),
        (SEED, SEED, "gemma4:latest", False, RuleOrigin.CONFIG),
        (rules("allow_all", ["gemma4"]), SEED, "gemma4", False, RuleOrigin.CONFIG),  # another spelling
        (rules("allow_all", [], ["gemma4:latest"]), SEED, "gemma4:latest", True, RuleOrigin.UI),  # other list
        (rules("allow_all", ["gemma4"], ["gemma4"]), SEED, "gemma4", False, RuleOrigin.UI),  # one beside it
        (rules("allow_all", ["x"]), rules("allow_all", ["x"], ["x"]), "x", False, RuleOrigin.UI),  # one gone
        (SEED, SEED, "gemma4:*", True, RuleOrigin.CONFIG),
        (rules("allow_all", ["gemma4:*"]), SEED, "gemma4:*", False, RuleOrigin.UI),
        (rules("allow_all", [], ["gemma4*"]), SEED, "gemma4*", True, RuleOrigin.UI),  # a different prefix
        (rules("allow_all", ["qwen3:8b"]), SEED, "qwen3:8b", False, RuleOrigin.UI),
    ],
)
def test_rule_origin(
    rules_: PlacementRules, baseline: PlacementRules | None, pattern: str, denied: bool, origin: RuleOrigin
) -> None:
    assert rule_origin(rules_, baseline, parse_pattern(pattern), denied=denied) is origin


def test_exact_rules_and_mode_origin() -> None:
    override = rules("whitelist", ["gemma4:latest", "qwen3:8b"], ["gemma4:*", "x"])
    assert exact_rules(override, SEED) == [
        {"model": "gemma4:latest", "list": "allowed", "origin": "config"},
        {"model": "qwen3:8b", "list": "allowed", "origin": "ui"},
        {"model": "x", "list": "denied", "origin": "ui"},
    ]
    assert mode_origin(override, SEED) is RuleOrigin.UI and mode_origin(SEED, SEED) is RuleOrigin.CONFIG
    assert mode_origin(override, None) is RuleOrigin.CONFIG


@pytest.mark.parametrize(
    ("rules_", "model", "expected"),
    [
        (SEED, "gemma4:latest", (True, "gemma4:latest", True, RuleOrigin.CONFIG)),
        (SEED, "gemma4:2b", (False, "gemma4:*", False, RuleOrigin.CONFIG)),
        (SEED, "qwen3:8b", (True, "mode", False, RuleOrigin.CONFIG)),
        (rules("whitelist", [], ["gemma4:*"]), "qwen3:8b", (False, "mode", False, RuleOrigin.UI)),
        (rules("allow_all", [], ["gemma4:*", "gemma4"]), "gemma4", (False, "gemma4", True, RuleOrigin.UI)),
    ],
)
def test_decide_is_the_verdict_with_its_origin(
    rules_: PlacementRules, model: str, expected: tuple[bool, str, bool, RuleOrigin]
) -> None:
    decision = decide(rules_, model, SEED)
    verdict = resolve_placement(rules_, model)
    assert (decision.allowed, decision.rule, decision.exact) == (verdict.allowed, verdict.rule, verdict.exact)
    assert (decision.allowed, decision.rule, decision.exact, decision.origin) == expected


def test_toggle_rejects_pattern() -> None:
    with pytest.raises(ValueError, match="exact model name"):
        toggle_rule(SEED, "gemma4:*")


def test_parse_rejects_bad_pattern_and_mode() -> None:
    with pytest.raises(ValueError, match="last character"):
        PlacementRules.parse("allow_all", ["ge*ma"])
    with pytest.raises(ValueError):
        PlacementRules.parse("deny_all")


def test_json_round_trip() -> None:
    assert PlacementRules.parse(**SEED.to_json()) == SEED  # type: ignore[arg-type]
