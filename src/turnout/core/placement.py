"""Model placement: may this worker serve this model?

Hard rules that adaptive scoring never overrides. Resolution for one worker and one model:

1. an exact rule (allowed or denied) for the model decides;
2. else the longest matching prefix rule decides;
3. else the worker's mode decides: ``allow_all`` allows, ``whitelist`` denies.

At equal specificity a deny rule wins over an allow rule. Names compare canonically (a tagless name is
``:latest``, :mod:`turnout.core.names`), so every spelling of one model gets one verdict: the placement
matrix, the router, discovery lists and the toggle all call :func:`resolve_placement`.

Origins: a worker's effective rules are its UI override (when one exists) or its config baseline, and the
override outranks the baseline whole. Each rule of an override has an origin, ``config`` or ``ui``
(:func:`rule_origin`): a prefix rule is ``config`` when the baseline has it in the same list; the exact rules
for one model are ``config`` when they are exactly the baseline's exact rules for that model (same lists, any
spelling), else ``ui`` (an exception made through the admin API or UI). :func:`decide` gives a cell its
verdict (from :func:`resolve_placement`) with the origin of the deciding rule.

The toggle (:func:`toggle_rule`): over a UI exception it removes the exception and the baseline's exact rules
for the model apply again (an exception that said what the other rules say goes, and the cell keeps its
verdict); anywhere else it flips the cell, writing the exact rule for the opposite verdict into the override, in
place of any exact rule the override holds for that model (a config rule, copied): so a click outvotes an exact
config rule too, and the second click brings it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from turnout.core.patterns import Pattern, best_match, parse_pattern

__all__ = [
    "Decision",
    "PlacementMode",
    "PlacementRules",
    "RuleOrigin",
    "Verdict",
    "decide",
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


def _key(pattern: Pattern) -> tuple[bool, str]:
    return pattern.exact, pattern.prefix


def _exact_lists(rules: PlacementRules, name: str) -> tuple[bool, bool]:
    """Whether ``rules`` allow and whether they deny the canonical ``name`` by an exact rule."""
    return (
        any(p.exact and p.prefix == name for p in rules.allowed),
        any(p.exact and p.prefix == name for p in rules.denied),
    )


def rule_origin(
    rules: PlacementRules, baseline: PlacementRules | None, pattern: Pattern, *, denied: bool
) -> RuleOrigin:
    """Where one rule of a worker's effective ``rules`` comes from. ``baseline`` None: the rules are the
    baseline itself (no override), so every rule is a config rule. An exact rule is a config rule when the
    exact rules for its model are the baseline's (so an exact rule that replaced the config's, or sits beside
    it, is an exception); a prefix rule when the baseline has it in the same list."""
    if baseline is None:
        return RuleOrigin.CONFIG
    if pattern.exact:
        same = _exact_lists(rules, pattern.prefix) == _exact_lists(baseline, pattern.prefix)
        return RuleOrigin.CONFIG if same else RuleOrigin.UI
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
                origin = rule_origin(rules, baseline, p, denied=denied)
                out.append({"model": p.text, "list": "denied" if denied else "allowed", "origin": origin.value})
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one model: allowed or not, which rule decided (a pattern or ``mode``)."""

    allowed: bool
    rule: str
    exact: bool


class Decision(NamedTuple):
    """A verdict with the origin of the rule (or mode) that decided it: what the matrix shows in a cell (a
    named tuple: the matrix makes one per cell, and a frozen dataclass costs several times as much to make)."""

    allowed: bool
    rule: str
    exact: bool
    origin: RuleOrigin


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


def decide(rules: PlacementRules, model: str, baseline: PlacementRules | None) -> Decision:
    """:func:`resolve_placement` for ``model`` (the router's verdict) and where its deciding rule comes from;
    ``baseline`` as for :func:`rule_origin`."""
    verdict = resolve_placement(rules, model)
    if verdict.rule == "mode":
        return _MODE_DECISIONS[verdict.allowed, mode_origin(rules, baseline)]
    origin = rule_origin(rules, baseline, parse_pattern(verdict.rule), denied=not verdict.allowed)
    return Decision(verdict.allowed, verdict.rule, verdict.exact, origin)


_MODE_DECISIONS = {
    (allowed, origin): Decision(allowed, "mode", False, origin) for allowed in (False, True) for origin in RuleOrigin
}


def toggle_rule(rules: PlacementRules, model: str, *, baseline: PlacementRules | None = None) -> PlacementRules:
    """The UI toggle: the rules after one click on ``model``'s cell (the admin API's toggle and the matrix's
    click both call it).

    ``rules`` are the worker's effective rules; ``baseline`` its config baseline (None: no baseline is known,
    and every exact rule counts as an exception). Over a UI exception (the exact rules for ``model`` differ
    from the baseline's) the click removes the exception and puts the baseline's exact rules for ``model``
    back, whatever the verdict then is: an exception that agreed with the rest of the rules (an exact allow on
    an ``allow_all`` worker) is removed and the cell keeps its verdict, now from the config file. Anywhere else
    the click flips the cell: the exact rule for the opposite verdict replaces whatever exact rules ``rules``
    hold for ``model``, so an exact config rule is outvoted by the override, as any config rule is; where
    ``rules`` hold no exact rule for ``model`` but the baseline does and putting those back flips the cell, they
    are put back (so that the next click, over no exception, flips it again: two clicks undo each other)."""
    target = parse_pattern(model)
    if not target.exact:
        raise ValueError(f"toggle needs an exact model name, got pattern {model!r}")
    name = target.prefix
    theirs = (False, False) if baseline is None else _exact_lists(baseline, name)
    mine = _exact_lists(rules, name)
    allowed, denied = _without_exact(rules.allowed, name), _without_exact(rules.denied, name)
    restored = None  # ``rules`` with the baseline's exact rules for the model in place of their own
    if baseline is not None:
        restored = PlacementRules(
            mode=rules.mode,
            allowed=_restore(allowed, baseline.allowed, name),
            denied=_restore(denied, baseline.denied, name),
        )
    if mine not in ((False, False), theirs):  # a UI exception: the click removes it
        return restored if restored is not None else PlacementRules(mode=rules.mode, allowed=allowed, denied=denied)
    verdict = resolve_placement(rules, model).allowed
    # the override dropped the config's exact rules for it: where putting them back flips the cell, that is the
    # click (and the next click, over no exception, flips it back)
    dropped = mine == (False, False) and theirs != (False, False)
    if dropped and restored is not None and resolve_placement(restored, model).allowed is not verdict:
        return restored
    if verdict:
        return PlacementRules(mode=rules.mode, allowed=allowed, denied=(*denied, target))
    return PlacementRules(mode=rules.mode, allowed=(*allowed, target), denied=denied)


def _without_exact(patterns: tuple[Pattern, ...], name: str) -> tuple[Pattern, ...]:
    """``patterns`` without the exact rules for the canonical ``name`` (every spelling of the model)."""
    return tuple(p for p in patterns if not (p.exact and p.prefix == name))


def _restore(kept: tuple[Pattern, ...], baseline: tuple[Pattern, ...], name: str) -> tuple[Pattern, ...]:
    """``kept`` with the baseline's exact rules for ``name`` back in their baseline places (where ``kept`` is
    the baseline's list without them, the result is that list again)."""
    out = list(kept)
    for index, p in enumerate(baseline):
        if p.exact and p.prefix == name:
            out.insert(min(index, len(out)), p)
    return tuple(out)


def _dedupe(patterns: Iterable[Pattern]) -> tuple[Pattern, ...]:
    return tuple(dict.fromkeys(patterns))
