import pytest

from turnout.core.placement import PlacementRules, resolve_placement, toggle_rule

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
