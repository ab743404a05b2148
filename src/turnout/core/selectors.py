"""Kubernetes label selectors (``metav1.LabelSelector``): ``matchLabels`` and ``matchExpressions`` with the
operators ``In``, ``NotIn``, ``Exists`` and ``DoesNotExist``, all ANDed.

One rule for every place a selector picks pods: a ModelClaim's ``podSelector`` (AIBrix's ``ModelClaimSpec``
declares it a ``*metav1.LabelSelector``) in the local controller and the operator, and a pool Deployment's
``spec.selector`` in the operator. :meth:`LabelSelector.matches` is what Kubernetes' ``LabelSelectorAsSelector``
decides (``NotIn`` also matches a pod without the label; an empty selector matches every pod);
:meth:`LabelSelector.query` is the same selector as the API server's ``labelSelector`` query parameter.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OPERATORS", "InvalidSelector", "LabelSelector", "Requirement", "parse_label_selector"]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class InvalidSelector(ValueError):
    """The selector cannot be read; the message names the field and what to write instead."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # one of OPERATORS
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist

    def query(self) -> str:
        if self.operator in ("In", "NotIn"):
            return f"{self.key} {self.operator.lower()} ({','.join(self.values)})"
        return self.key if self.operator == "Exists" else f"!{self.key}"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )

    def query(self) -> str:
        """The ``labelSelector`` query string (``""`` selects everything)."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        return ",".join(parts + [r.query() for r in self.match_expressions])


def parse_label_selector(value: Any, where: str) -> LabelSelector:
    """A ``LabelSelector`` object; ``where`` names the field in messages (``spec.podSelector``). A plain
    ``{label: value}`` map, which earlier Turnout claims used, is read as its ``matchLabels``."""
    if not isinstance(value, Mapping):
        raise InvalidSelector(
            f"{where} must be a label selector: {{matchLabels: {{label: value}}, matchExpressions: [...]}}"
        )
    if value and not set(value) & {"matchLabels", "matchExpressions"}:
        value = {"matchLabels": value}  # the plain map form
    unknown = set(value) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise InvalidSelector(f"{where} has unknown field(s) {sorted(unknown)}: use matchLabels and matchExpressions")
    labels = value.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise InvalidSelector(f"{where}.matchLabels must map label names to string values")
    expressions = value.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise InvalidSelector(f"{where}.matchExpressions must be a list of {{key, operator, values}}")
    return LabelSelector(
        dict(labels), tuple(_requirement(e, f"{where}.matchExpressions[{i}]") for i, e in enumerate(expressions))
    )


def _requirement(raw: Any, where: str) -> Requirement:
    if not isinstance(raw, Mapping):
        raise InvalidSelector(f"{where} must be an object {{key, operator, values}}")
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values")
    if not isinstance(key, str) or not key:
        raise InvalidSelector(f"{where}.key is required")
    if operator not in OPERATORS:
        raise InvalidSelector(f"{where}.operator must be one of {', '.join(OPERATORS)}, got {operator!r}")
    values = values or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise InvalidSelector(f"{where}.values must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise InvalidSelector(f"{where}: {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise InvalidSelector(f"{where}: {operator} takes no values; remove them")
    return Requirement(key, str(operator), tuple(sorted(set(values))))
