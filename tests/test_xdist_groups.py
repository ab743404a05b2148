"""tests/support/xdist_groups.py: under two pytest-xdist processes, the files of a group run in one process, one
after another, and every other file goes whole to one process. Run for real: pytest with -n 2 on generated files,
each test writing down the process it ran in and when."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.xdist_groups import scope_of

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
from tests.support.xdist_groups import FileGroupScheduling
GROUPS = {"tests/test_a.py": "ports", "tests/test_b.py": "ports"}

def pytest_xdist_make_scheduler(config, log):
    return FileGroupScheduling(config, log, GROUPS) if config.getvalue("dist") == "loadfile" else None
"""

TESTS = """
import json, os, time
import pytest

@pytest.mark.parametrize("n", range(4))
def test_one(n):
    start = time.monotonic()
    time.sleep(0.05)
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps([__name__, os.environ["PYTEST_XDIST_WORKER"], start, time.monotonic()]) + "\\n")
"""


def _run(tmp_path: Path, dist: str) -> list[tuple[str, str, float, float]]:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "conftest.py").write_text(CONFTEST)
    for name in "abcd":
        (tmp_path / "tests" / f"test_{name}.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / f"record-{dist}.jsonl"
    env = {**os.environ, "RECORD": str(record), "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", dist, "-q", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [tuple(json.loads(line)) for line in record.read_text().splitlines()]  # type: ignore[misc]


def test_the_files_of_a_group_run_in_one_process_one_after_another(tmp_path: Path) -> None:
    runs = _run(tmp_path, "loadfile")
    assert len(runs) == 16
    workers = {module: {w for m, w, _, _ in runs if m == module} for module in {m for m, *_ in runs}}
    assert all(len(w) == 1 for w in workers.values()), workers  # each file whole to one process
    assert workers["test_a"] == workers["test_b"], workers  # the group's files in the same one
    grouped = [(start, end) for m, _, start, end in runs if m in ("test_a", "test_b")]
    grouped.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(grouped))


def test_another_dist_asked_for_is_xdists_own(tmp_path: Path) -> None:
    """--dist load spreads a file's tests: the groups apply to loadfile only, which scripts/test asks for."""
    runs = _run(tmp_path, "load")
    assert len(runs) == 16


@pytest.mark.parametrize(
    ("nodeid", "scope"),
    [
        ("tests/test_a.py::test_one[0]", "ports"),
        ("tests/test_a.py::Class::test_x", "ports"),
        ("tests/test_c.py::test_one[tests/test_a.py::x]", "tests/test_c.py"),
        ("tests/sub/test_a.py::test_one", "tests/sub/test_a.py"),
        ("tests/test_d.py", "tests/test_d.py"),
    ],
)
def test_scope_of(nodeid: str, scope: str) -> None:
    assert scope_of(nodeid, {"tests/test_a.py": "ports", "tests/test_b.py": "ports"}) == scope
