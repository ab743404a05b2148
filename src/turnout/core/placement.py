"""Model placement: may this worker serve this model?

Hard rules that adaptive scoring never overrides. Resolution for one worker and one model:

1. an exact rule (allowed or denied) for the model decides;
2. else the longest matching prefix rule decides;
3. else the worker's mode decides: ``allow_all`` allows, ``whitelist`` denies.

At equal specificity a deny rule wins over an allow rule. Names compare canonically (a tagless name is
``:latest``, :mod:`turnout.core.names`), so every spelling of one model gets one verdict: the placement
matrix, the router, discovery lists and the toggle all call :func:`resolve_placement`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from turnout.core.patterns import Pattern, best_match, parse_pattern

__all__ = ["PlacementMode", "PlacementRules", "Verdict", "resolve_placement", "toggle_rule"]


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


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one model: allowed or not, which rule decided (a pattern or ``mode``)."""

    allowed: bool
    rule: str
    exact: bool


def resolve_placement(rules: PlacementRules, model: str) -> Verdict:
    best_allow = best_match(model, rules.allowed)
    best_deny = best_match(model, rules.denied)
    if best_deny is not None and (best_allow is None or best_deny.specificity >= best_allow.specificity):
        return Verdict(allowed=False, rule=best_deny.text, exact=best_deny.exact)
    if best_allow is not None:
        return Verdict(allowed=True, rule=best_allow.text, exact=best_allow.exact)
    return Verdict(allowed=rules.mode is PlacementMode.ALLOW_ALL, rule="mode", exact=False)


def toggle_rule(rules: PlacementRules, model: str) -> PlacementRules:
    """The UI toggle: drop an exact rule for ``model`` if one exists, else add one that flips the verdict."""
    target = parse_pattern(model)
    if not target.exact:
        raise ValueError(f"toggle needs an exact model name, got pattern {model!r}")
    # an exact rule for the same model in another spelling ("gemma4" for "gemma4:latest") is the same rule
    allowed = tuple(p for p in rules.allowed if not (p.exact and p.prefix == target.prefix))
    denied = tuple(p for p in rules.denied if not (p.exact and p.prefix == target.prefix))
    if len(allowed) != len(rules.allowed) or len(denied) != len(rules.denied):
        return PlacementRules(mode=rules.mode, allowed=allowed, denied=denied)
    if resolve_placement(rules, model).allowed:
        return PlacementRules(mode=rules.mode, allowed=allowed, denied=(*denied, target))
    return PlacementRules(mode=rules.mode, allowed=(*allowed, target), denied=denied)


def _dedupe(patterns: Iterable[Pattern]) -> tuple[Pattern, ...]:
    return tuple(dict.fromkeys(patterns))
