"""The placement override file with several writers (turnout.state.placement_store): real processes writing
different workers' overrides at the same moment lose none, and a reader always sees whole files."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turnout.core.placement import PlacementRules
from turnout.state.placement_store import PlacementFileError, PlacementStore

# One writer: waits for the start file, then writes its worker's override ROUNDS times, each with one more
# denied model, and after each write reads the file as it is on disk: how many rules the other writer's
# worker has there. A lost update shows as that number going down (this writer put back an older copy).
WRITER = """
import json, pathlib, sys, time
from turnout.core.placement import PlacementRules
from turnout.state.placement_store import PlacementStore

path, me, other, rounds, start = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
store = PlacementStore(path)
store.load()
deadline = time.monotonic() + 30
while not pathlib.Path(start).exists() and time.monotonic() < deadline:
    time.sleep(0.001)
seen = []
for i in range(rounds):
    store.put(me, PlacementRules.parse("allow_all", [], [f"{me}-{n}" for n in range(i + 1)]))
    on_disk = json.loads(path.read_text())["workers"]
    seen.append(len(on_disk.get(other, {}).get("denied_models", [])))
print(json.dumps(seen))
"""

ROUNDS = 150


def _writer(path: Path, me: str, other: str, start: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", WRITER, str(path), me, other, str(ROUNDS), str(start)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_two_processes_writing_different_workers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "model-placement.json"
    start = tmp_path / "go"
    writers = [_writer(path, "a", "b", start), _writer(path, "b", "a", start)]
    try:
        time.sleep(0.5)  # both import and load first, then write at the same moment
        start.touch()
        results = [w.communicate(timeout=120) for w in writers]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
    for writer, (_, err) in zip(writers, results, strict=True):
        assert writer.returncode == 0, err
    seen_by_a, seen_by_b = (json.loads(out) for out, _ in results)
    # never did a write put back an older copy of the other worker's override
    for seen in (seen_by_a, seen_by_b):
        drops = [(i, x, y) for i, (x, y) in enumerate(itertools.pairwise(seen)) if y < x]
        assert not drops, drops
    final = PlacementStore(path)
    final.load()
    for me in ("a", "b"):
        rules = final.get(me)
        assert rules is not None and [p.text for p in rules.denied] == [f"{me}-{n}" for n in range(ROUNDS)]
    assert max(seen_by_a) > 0 and max(seen_by_b) > 0  # they did overlap


def test_a_write_starts_from_the_file_not_from_memory(tmp_path: Path) -> None:
    path = tmp_path / "model-placement.json"
    first, second = PlacementStore(path), PlacementStore(path)
    first.load()
    second.load()
    first.put("a", PlacementRules.parse("whitelist"))
    second.put("b", PlacementRules.parse("whitelist"))  # knew nothing of "a" in memory
    first.put("c", PlacementRules.parse("whitelist"))  # nor this one of "b"
    final = PlacementStore(path)
    final.load()
    assert sorted(final.all()) == ["a", "b", "c"]
    assert sorted(first.all()) == ["a", "b", "c"]  # what it wrote it now holds, the others' writes included
    assert (tmp_path / "model-placement.json.lock").exists()  # the writers' lock, beside the file


def test_a_broken_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "model-placement.json"
    store = PlacementStore(path)
    store.put("a", PlacementRules.parse("whitelist"))
    path.write_text('{"workers": {"a": {"mode": "sometimes"}}}')
    with pytest.raises(PlacementFileError, match="refusing to overwrite"):
        store.put("b", PlacementRules.parse("whitelist"))
    assert "sometimes" in path.read_text()
    assert store.get("a") == PlacementRules.parse("whitelist")  # the last good overrides stay in force
