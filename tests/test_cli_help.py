"""`turnout --version`, the help screens and what a short command imports: the real command, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.conftest import free_port
from tests.support.cli import TURNOUT
from turnout import __version__
from turnout.cli import COMMANDS as GROUP_OF
from turnout.cli import app, build

HEAVY = ("sqlalchemy", "alembic", "aiohttp", "cryptography", "jinja2", "prometheus_client", "rich", "yaml")


def run(args: list[str], cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TURNOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )


def _commands(command: Any, path: list[str], parent: Any = None) -> Iterator[list[str]]:
    yield path
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command, info_name=path[-1] if path else "turnout", parent=parent)
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), [*path, name], ctx)


COMMANDS = list(_commands(typer.main.get_command(app), []))


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag(flag: str) -> None:
    result = run([flag])
    assert result.returncode == 0 and result.stdout == f"turnout {__version__}\n"


def test_every_command_is_walked() -> None:
    assert ["serve"] in COMMANDS and ["key", "list"] in COMMANDS and ["claim", "delete"] in COMMANDS


def test_each_command_is_built_from_its_own_group_alone() -> None:
    """`turnout key list` builds the module that registers ``key`` and no other (turnout.cli.COMMANDS): every
    top-level command is named there, with the module that registers it, and nothing else is."""
    top = {path[0] for path in COMMANDS if path} - {"version"}
    assert set(GROUP_OF) == top
    for name, group in GROUP_OF.items():
        alone = typer.main.get_command(build([group]))
        listed = alone.list_commands(typer.Context(alone, info_name="turnout"))  # type: ignore[attr-defined]
        assert name in listed, f"{name}: not registered by turnout.cli.{group}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "turnout")
def test_help_fits_80_columns_and_has_no_typer_quirks(command: list[str]) -> None:
    result = run([*command, "--help"], COLUMNS="80")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Usage: ")
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    assert "<bool>" not in result.stdout  # typer's rich help printed '--help <bool>' after every flag
    assert not any(ch in result.stdout for ch in "╭│╰─"), "box drawing (rich help)"
    # every option and argument says what it is for: a line listing one ends with more than its name and type
    section = None
    for line in lines:
        if line and not line.startswith(" "):
            section = line
        elif section in ("Options:", "Arguments:") and line.startswith("  ") and not line.startswith("   "):
            described = line.strip().split("  ", 1)
            assert len(described) == 2 and described[1].strip(), f"{' '.join(command)}: no help for {line.strip()}"


def test_top_level_help_lists_serve_first() -> None:
    lines = run(["--help"], COLUMNS="80").stdout.splitlines()
    listed = lines[lines.index("Commands:") + 1 :]
    assert listed[0].split()[0] == "serve"


def _imported(args: list[str], cwd: Path) -> set[str]:
    """The top-level packages the real command imports (``python -X importtime`` writes one line per module)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "turnout", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.add(name.split(".")[0])
    assert "turnout" in names  # the parse saw the command's own imports
    return names


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["serve", "--help"], ["key", "list", "--help"]])
def test_help_imports_no_heavy_stack(tmp_path: Path, args: list[str]) -> None:
    heavy = _imported(args, tmp_path) & set(HEAVY)
    assert not heavy, f"turnout {' '.join(args)} imported {sorted(heavy)}"


def test_key_list_on_a_migrated_store_skips_alembic_and_aiohttp(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    # a free listen port: no gateway answers there, so the commands read the store
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "listen": {"port": free_port()}}))
    first = run(["key", "create", "--app", "web", "--config", str(config)], tmp_path)
    assert first.returncode == 0, first.stderr  # creates and migrates the store
    imported = _imported(["key", "list", "--config", str(config)], tmp_path)
    assert "sqlalchemy" in imported  # it does read the store
    assert not imported & {"alembic", "aiohttp", "jinja2", "prometheus_client", "rich"}
