"""Model-name patterns used by placement rules and per-model limits.

A pattern is either an exact model name (``qwen3:8b``), a prefix with a single trailing ``*``
(``gemma4:*``, ``orcarouter/*``) or ``*`` alone, which matches every model. Any other use of ``*``
is an error. Specificity orders patterns: an exact name beats any prefix, and a longer prefix beats a
shorter one (``*`` is the prefix of length 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Pattern", "PatternError", "best_match", "best_value", "parse_pattern"]

T = TypeVar("T")


class PatternError(ValueError):
    """A string is not a valid model pattern; the message says why."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed model pattern. ``text`` is what the operator wrote."""

    text: str
    prefix: str
    exact: bool

    def matches(self, model: str) -> bool:
        if self.exact:
            return model == self.text
        return model.startswith(self.prefix)

    @property
    def specificity(self) -> tuple[int, int]:
        """Sort key: higher is more specific. Exact names rank above every prefix."""
        return (1, len(self.text)) if self.exact else (0, len(self.prefix))


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
        return Pattern(text=text, prefix=text, exact=True)
    if star != len(text) - 1:
        raise PatternError(
            f"pattern {text!r}: '*' is only allowed once, as the last character (e.g. 'gemma4:*' or '*')"
        )
    return Pattern(text=text, prefix=text[:-1], exact=False)


def best_match(model: str, patterns: Iterable[Pattern]) -> Pattern | None:
    """The most specific pattern matching ``model``, or None. Ties keep the first given."""
    best: Pattern | None = None
    for pattern in patterns:
        if pattern.matches(model) and (best is None or pattern.specificity > best.specificity):
            best = pattern
    return best


def best_value(model: str, table: Mapping[Pattern, T]) -> T | None:
    """The value of the most specific pattern in ``table`` matching ``model``."""
    pattern = best_match(model, table.keys())
    return None if pattern is None else table[pattern]
