"""Model placement: may this worker serve this model?

Hard rules that adaptive scoring never overrides. Resolution for one worker and one model:

1. an exact rule (allowed or denied) for the model decides;
2. else the longest matching prefix rule decides;
3. else the worker's mode decides: ``allow_all`` allows, ``whitelist`` denies.

At equal specificity a deny rule wins over an allow rule. Names compare canonically (a tagless name is
``:latest``, :mod:`turnout.core.names`), so every spelling of one model gets one verdict: the placement
matrix, the router, discovery lists and the toggle all call :func:`resolve_placement`.

Origins: a worker's effective rules are its UI override (when one exists) or its config baseline. A rule of
the override that the baseline also has (same list, same pattern in any spelling) comes from the config;
any other rule is a UI exception (:func:`rule_origin`). The toggle (:func:`toggle_rule`) removes only UI
exceptions, never a config rule, so a second click undoes the first and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from turnout.core.patterns import Pattern, best_match, parse_pattern

__all__ = [
    "ConfigRuleError",
    "PlacementMode",
    "PlacementRules",
    "RuleOrigin",
    "Verdict",
    "exact_rules",
    "mode_origin",
    "resolve_placement",
    "rule_origin",
    "toggle_rule",
]


class PlacementMode(StrEnum):
    ALLOW_ALL = "allow_all"
    WHITELIST = "whitelist"


@dataclass(frozen=True, slots=True)
class PlacementRules:
    """One worker's ruleset (from config, or a UI override)."""

    mode: PlacementMode = PlacementMode.ALLOW_ALL
    allowed: tuple[Pattern, ...] = ()
    denied: tuple[Pattern, ...] = ()

    @classmethod
    def parse(cls, mode: str, allowed_models: Iterable[str] = (), denied_models: Iterable[str] = ()) -> PlacementRules:
        """Build rules from their JSON form; raises ValueError (PatternError) naming the bad pattern."""
        return cls(
            mode=PlacementMode(mode),
            allowed=_dedupe(parse_pattern(p) for p in allowed_models),
            denied=_dedupe(parse_pattern(p) for p in denied_models),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode.value,
            "allowed_models": [p.text for p in self.allowed],
            "denied_models": [p.text for p in self.denied],
        }

    def exact_names(self) -> set[str]:
        return {p.text for p in (*self.allowed, *self.denied) if p.exact}

    def exact_rule(self, model: str) -> Pattern | None:
        """The exact rule (allow or deny) naming ``model`` in any spelling, if there is one."""
        want = parse_pattern(model).prefix if "*" not in model else None
        for p in (*self.allowed, *self.denied):
            if p.exact and p.prefix == want:
                return p
        return None


class RuleOrigin(StrEnum):
    CONFIG = "config"  # the worker's baseline in config.json has this rule
    UI = "ui"  # an exception added by the admin API / UI (only in the override)


class ConfigRuleError(ValueError):
    """The toggle cannot flip a verdict decided by an exact config deny (deny wins at equal specificity)."""


def _key(pattern: Pattern) -> tuple[bool, str]:
    return pattern.exact, pattern.prefix


def rule_origin(baseline: PlacementRules | None, pattern: Pattern, *, denied: bool) -> RuleOrigin:
    """Where one rule of a worker's effective rules comes from. ``baseline`` None: the rules are the
    baseline itself (no override), so every rule is a config rule."""
    if baseline is None:
        return RuleOrigin.CONFIG
    same_list = baseline.denied if denied else baseline.allowed
    return RuleOrigin.CONFIG if any(_key(p) == _key(pattern) for p in same_list) else RuleOrigin.UI


def mode_origin(rules: PlacementRules, baseline: PlacementRules | None) -> RuleOrigin:
    return RuleOrigin.CONFIG if baseline is None or baseline.mode is rules.mode else RuleOrigin.UI


def exact_rules(rules: PlacementRules, baseline: PlacementRules | None) -> list[dict[str, str]]:
    """Every exact rule with its list and origin: ``{"model", "list": "allowed"|"denied", "origin"}``."""
    out = []
    for denied, patterns in ((False, rules.allowed), (True, rules.denied)):
        for p in patterns:
            if p.exact:
                origin = rule_origin(baseline, p, denied=denied)
                out.append({"model": p.text, "list": "denied" if denied else "allowed", "origin": origin.value})
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one model: allowed or not, which rule decided (a pattern or ``mode``)."""

    allowed: bool
    rule: str
    exact: bool


_BY_MODE = {mode: Verdict(allowed=mode is PlacementMode.ALLOW_ALL, rule="mode", exact=False) for mode in PlacementMode}


def resolve_placement(rules: PlacementRules, model: str) -> Verdict:
    if not rules.allowed and not rules.denied:  # no patterns (most workers): the mode decides
        return _BY_MODE[rules.mode]
    best_allow = best_match(model, rules.allowed)
    best_deny = best_match(model, rules.denied)
    if best_deny is not None and (best_allow is None or best_deny.specificity >= best_allow.specificity):
        return Verdict(allowed=False, rule=best_deny.text, exact=best_deny.exact)
    if best_allow is not None:
        return Verdict(allowed=True, rule=best_allow.text, exact=best_allow.exact)
    return Verdict(allowed=rules.mode is PlacementMode.ALLOW_ALL, rule="mode", exact=False)


def toggle_rule(rules: PlacementRules, model: str, *, baseline: PlacementRules | None = None) -> PlacementRules:
    """The UI toggle: drop the UI exceptions (exact rules) for ``model`` if there are any, else add an exact
    rule that flips the verdict.

    ``rules`` are the worker's effective rules; ``baseline`` is its config baseline when ``rules`` are an
    override (None: ``rules`` are the baseline, or no baseline is known and every exact rule counts as an
    exception). A rule the baseline has (:func:`rule_origin` says ``config``) is never removed: a click on
    a cell decided by an exact config rule adds an exception instead. An exact config deny cannot be
    outvoted (deny wins at equal specificity): :class:`ConfigRuleError` says to edit the ruleset instead."""
    target = parse_pattern(model)
    if not target.exact:
        raise ValueError(f"toggle needs an exact model name, got pattern {model!r}")

    def removable(p: Pattern, denied: bool) -> bool:
        # an exact rule for the same model in another spelling ("gemma4" for "gemma4:latest") is the same rule
        if not (p.exact and p.prefix == target.prefix):
            return False
        return baseline is None or rule_origin(baseline, p, denied=denied) is RuleOrigin.UI

    allowed = tuple(p for p in rules.allowed if not removable(p, False))
    denied = tuple(p for p in rules.denied if not removable(p, True))
    if len(allowed) != len(rules.allowed) or len(denied) != len(rules.denied):
        return PlacementRules(mode=rules.mode, allowed=allowed, denied=denied)
    verdict = resolve_placement(rules, model)
    if verdict.allowed:
        return PlacementRules(mode=rules.mode, allowed=allowed, denied=(*denied, target))
    if verdict.exact:
        raise ConfigRuleError(
            f'"{model}" is denied by the exact config rule "{verdict.rule}"; a UI exception cannot allow it '
            "(a deny wins at equal specificity): change the worker's ruleset instead"
        )
    return PlacementRules(mode=rules.mode, allowed=(*allowed, target), denied=denied)


def _dedupe(patterns: Iterable[Pattern]) -> tuple[Pattern, ...]:
    return tuple(dict.fromkeys(patterns))
