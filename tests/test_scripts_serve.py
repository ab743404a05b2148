"""`./scripts/serve` installs the checkout once: a second start runs no pip, a changed pyproject.toml does.

A copy of the checkout gets its own ./.venv that sees the test environment's packages (a .pth file, so
pip finds every dependency installed and nothing is downloaded); the script runs as a user runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.support.served import Served

ROOT = Path(__file__).resolve().parents[1]
INSTALLING = "scripts/serve: installing this checkout"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    path = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for rel in filter(None, files.split("\0")):
        source = ROOT / rel
        if source.is_file() and not rel.startswith(("tests/", "docs/screenshots/")):
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, path / rel)
    base = Path(sys._base_executable)  # type: ignore[attr-defined]  # the interpreter this venv was made from
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(path / ".venv")], check=True, timeout=120)
    venv_site = next((path / ".venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "_turnout_test_env.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    return path


def serve_once(checkout: Path) -> list[str]:
    """Run ./scripts/serve until it serves, stop it with Ctrl-C; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_") and k != "PYTHONPATH"}
    # --no-demo: the demo model's start is tests/test_quickstart.py's; here only whether pip runs
    process = Served(["./scripts/serve", "--port", str(free_port()), "--no-demo"], checkout, env)
    try:
        process.wait_for("serving on", limit_s=300)
        assert process.stop(signal.SIGINT) == 0
    finally:
        process.kill()
    return process.lines


def _installed(checkout: Path) -> list[tuple[str, int]]:
    """The files pip writes for the editable install, with their change times (a reinstall rewrites them)."""
    site = next((checkout / ".venv" / "lib").glob("python3*/site-packages"))
    found = [p for p in site.rglob("*") if p.is_file() and "turnout" in p.name.lower() and "_test_env" not in p.name]
    found += [checkout / ".venv" / "bin" / "turnout"]
    return sorted((str(p), p.stat().st_mtime_ns) for p in found)


def test_a_second_start_does_not_reinstall(checkout: Path) -> None:
    first = serve_once(checkout)
    assert any(INSTALLING in line for line in first), first
    assert (checkout / ".venv" / "bin" / "turnout").exists()
    installed = _installed(checkout)

    second = serve_once(checkout)
    assert not any(INSTALLING in line for line in second), second
    assert _installed(checkout) == installed  # pip did not run: nothing it writes was rewritten

    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n# a dependency changed\n")
    third = serve_once(checkout)
    assert any(INSTALLING in line for line in third), third
