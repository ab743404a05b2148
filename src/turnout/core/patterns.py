"""Model-name patterns used by placement rules and per-model limits.

A pattern is either an exact model name (``qwen3:8b``), a prefix with a single trailing ``*``
(``gemma4:*``, ``orcarouter/*``) or ``*`` alone, which matches every model. Any other use of ``*``
is an error. Specificity orders patterns: an exact name beats any prefix, and a longer prefix beats a
shorter one (``*`` is the prefix of length 0).

Names are compared in their canonical form (:func:`turnout.core.names.canonical`): a tagless name means
``:latest``, so the rule ``gemma4`` and the rule ``gemma4:latest`` are the same rule, both match a request
for either spelling, and ``gemma4:*`` matches a request for ``gemma4``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from turnout.core.names import canonical

__all__ = ["Pattern", "PatternError", "best_match", "best_value", "parse_pattern"]

T = TypeVar("T")


class PatternError(ValueError):
    """A string is not a valid model pattern; the message says why."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed model pattern. ``text`` is what the operator wrote."""

    text: str
    prefix: str  # for an exact pattern: the canonical name
    exact: bool

    def matches(self, model: str) -> bool:
        return self.matches_canonical(canonical(model))

    def matches_canonical(self, name: str) -> bool:
        """``matches`` for a name already in canonical form (callers that test many patterns)."""
        return name == self.prefix if self.exact else name.startswith(self.prefix)

    @property
    def specificity(self) -> tuple[int, int]:
        """Sort key: higher is more specific. Exact names rank above every prefix."""
        return (1, len(self.prefix)) if self.exact else (0, len(self.prefix))


def parse_pattern(text: str) -> Pattern:
    """Parse ``text`` into a :class:`Pattern`, or raise :class:`PatternError` saying what to change."""
    if not isinstance(text, str):
        raise PatternError(f"pattern must be a string, got {type(text).__name__}")
    if text == "":
        raise PatternError("pattern must not be empty")
    if text != text.strip():
        raise PatternError(f"pattern {text!r} has leading or trailing whitespace")
    star = text.find("*")
    if star == -1:
        return Pattern(text=text, prefix=canonical(text), exact=True)
    if star != len(text) - 1:
        raise PatternError(
            f"pattern {text!r}: '*' is only allowed once, as the last character (e.g. 'gemma4:*' or '*')"
        )
    return Pattern(text=text, prefix=text[:-1], exact=False)


def best_match(model: str, patterns: Iterable[Pattern]) -> Pattern | None:
    """The most specific pattern matching ``model``, or None. Ties keep the first given."""
    name = canonical(model)
    best: Pattern | None = None
    for pattern in patterns:
        if pattern.matches_canonical(name) and (best is None or pattern.specificity > best.specificity):
            best = pattern
    return best


def best_value(model: str, table: Mapping[Pattern, T]) -> T | None:
    """The value of the most specific pattern in ``table`` matching ``model``."""
    pattern = best_match(model, table.keys())
    return None if pattern is None else table[pattern]
