"""Label selectors decided as Kubernetes decides them (apimachinery labels.Selector), and their query form."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.core.selectors import InvalidSelector, parse_label_selector

POD = {"pool": "gpu", "tier": "a100", "zone": "b"}


@pytest.mark.parametrize(
    ("selector", "labels", "matches", "query"),
    [
        ({"matchLabels": {"pool": "gpu"}}, POD, True, "pool=gpu"),
        ({"matchLabels": {"pool": "cpu"}}, POD, False, "pool=cpu"),
        ({"pool": "gpu"}, POD, True, "pool=gpu"),  # the plain map earlier Turnout claims used
        ({}, POD, True, ""),  # an empty selector selects everything
        (
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["h100", "a100"]}]},
            POD,
            True,
            "tier in (a100,h100)",
        ),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["h100"]}]}, POD, False, "tier in (h100)"),
        ({"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["x"]}]}, POD, False, "gpu in (x)"),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["t4"]}]}, POD, True, "tier notin (t4)"),
        (
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a100"]}]},
            POD,
            False,
            "tier notin (a100)",
        ),
        # NotIn also matches a pod without the label (as Kubernetes decides)
        (
            {"matchExpressions": [{"key": "spot", "operator": "NotIn", "values": ["true"]}]},
            POD,
            True,
            "spot notin (true)",
        ),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, POD, True, "zone"),
        ({"matchExpressions": [{"key": "spot", "operator": "Exists"}]}, POD, False, "spot"),
        ({"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}, POD, True, "!spot"),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist", "values": []}]}, POD, False, "!zone"),
        (  # everything is ANDed
            {
                "matchLabels": {"pool": "gpu"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["a100"]},
                    {"key": "spot", "operator": "DoesNotExist"},
                ],
            },
            POD,
            True,
            "pool=gpu,tier in (a100),!spot",
        ),
        (
            {
                "matchLabels": {"pool": "gpu"},
                "matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}],
            },
            POD,
            False,
            "pool=gpu,zone notin (b)",
        ),
    ],
)
def test_selector_matches_and_query(selector: Any, labels: dict[str, str], matches: bool, query: str) -> None:
    parsed = parse_label_selector(selector, "spec.podSelector")
    assert parsed.matches(labels) is matches
    assert parsed.query() == query


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ([], "must be a label selector"),
        ({"matchLabels": {"pool": 1}}, "matchLabels must map"),
        ({"matchLabels": {"pool": "a"}, "other": 1}, "unknown field"),
        ({"matchExpressions": {"key": "a"}}, "must be a list"),
        ({"matchExpressions": [{"operator": "Exists"}]}, r"matchExpressions\[0\]\.key is required"),
        ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "operator must be one of"),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "In needs at least one value"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "Exists takes no values"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}, "values must be a list of strings"),
    ],
)
def test_invalid_selectors(selector: Any, fragment: str) -> None:
    with pytest.raises(InvalidSelector, match=fragment):
        parse_label_selector(selector, "spec.podSelector")
