"""docs/architecture.md's picture of the layers is the import-linter contracts' (pyproject.toml), and names every
package: the picture cannot drift from what `lint-imports` enforces."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(f"turnout.{p.parent.name}" for p in (ROOT / "src" / "turnout").glob("*/__init__.py"))


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _picture() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(node id -> label, edges) of the doc's one mermaid flowchart."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    (block,) = re.findall(r"```mermaid\n(.*?)```", text, flags=re.S)
    labels: dict[str, str] = {}
    edges = []
    for line in block.splitlines()[1:]:
        nodes = re.findall(r'(\w+)(?:\["([^"]+)"\])?', line.replace("-->", " "))
        for node, label in nodes:
            if label:
                labels[node] = label
        if "-->" in line:
            edges.append((nodes[0][0], nodes[1][0]))
    return labels, edges


def _depths(edges: list[tuple[str, str]]) -> dict[str, int]:
    """Each node's longest distance from the top (the picture is drawn top-down, layer by layer)."""
    depth: dict[str, int] = {}
    top = {a for a, _ in edges} - {b for _, b in edges}
    frontier = [(node, 0) for node in top]
    while frontier:  # a DAG of a dozen nodes: bounded by the edges' count squared
        node, d = frontier.pop()
        if depth.get(node, -1) >= d:
            continue
        depth[node] = d
        frontier.extend((b, d + 1) for a, b in edges if a == node)
    return depth


def test_the_picture_draws_the_layers_contract() -> None:
    labels, edges = _picture()
    depth = _depths(edges)
    drawn: dict[int, list[str]] = {}
    for node, d in depth.items():
        drawn.setdefault(d, []).extend(part.strip() for part in labels[node].split(","))
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    expected = [sorted(part.strip() for part in str(layer).split("|")) for layer in layers["layers"]]  # type: ignore[attr-defined]
    pictured = [sorted(drawn[d]) for d in sorted(drawn)]
    assert pictured[: len(expected)] == expected
    pure = {str(m) for c in _contracts() if c["type"] == "forbidden" for m in c["source_modules"]}  # type: ignore[attr-defined]
    assert pictured[len(expected) :] == [sorted(pure)], "the bottom of the picture is what the purity contracts cover"


def test_the_picture_names_every_package() -> None:
    labels, _ = _picture()
    named = {part.strip() for label in labels.values() for part in label.split(",")}
    assert set(PACKAGES) <= named, sorted(set(PACKAGES) - named)
