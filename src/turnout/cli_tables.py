"""Readable output of the CLI's listing commands (``usage``, ``audit``, ``key list``, ``endpoint list``,
``claim list``): aligned columns sized to their content (so they fit 80 columns where the values allow),
times in local ISO 8601 (``2026-12-03 18:20:05``), ``-`` for nothing. ``--json`` prints the data instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import typer

__all__ = ["WIDTH", "clip", "echo_json", "local_time", "ms", "render", "table"]

GAP = "  "
WIDTH = 80  # the terminal width tables aim for


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (ending in ``...`` when cut)."""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def local_time(ts: float | None, *, seconds: bool = True) -> str:
    """``2026-12-03 18:20:05`` in the machine's time zone (``-`` for None)."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.localtime(ts))


def ms(value: float | None) -> str:
    """A latency for a table: ``12 ms``, ``1.2 s`` (``-`` for None)."""
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = (), gap: str = GAP
) -> list[str]:
    """Lines of an aligned table: columns as wide as their widest cell, numbers (``right``) right-aligned,
    the last column unpadded."""
    cells = [[str(h) for h in headers], *[["-" if c is None or c == "" else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            (cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])) if i < len(row) - 1 else cell
            for i, cell in enumerate(row)
        ]
        if len(row) - 1 in right:
            parts[-1] = row[-1].rjust(widths[-1])
        lines.append(gap.join(parts).rstrip())
    return lines


def render(lines: list[str]) -> None:
    for line in lines:
        typer.echo(line)


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))
