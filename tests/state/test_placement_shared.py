"""Placement overrides on a shared store (turnout.state.placement_shared), on SQLite and a real PostgreSQL: the
store holds them, each data dir's override file is their copy in the design's format, a write through one data
dir is read by another, hand edits go into the store (or, broken, are kept and refuse writes), and writers on
different data dirs (different machines) lose nothing."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnout.config import load_settings
from turnout.core.placement import PlacementRules
from turnout.state.backup import create_backup
from turnout.state.placement_shared import SharedPlacementStore
from turnout.state.placement_store import PlacementFileError, PlacementStore
from turnout.state.restore import restore_backup
from turnout.store.db import Database
from turnout.store.shared_state import CHANGES, PLACEMENT, SharedState

WHITELIST = PlacementRules.parse("whitelist", ["qwen3:8b"])


@pytest.fixture
def shared(database_url: str) -> Iterator[SharedState]:
    db = Database(database_url)
    db.migrate()
    yield SharedState(db)
    db.close()


def replica(tmp_path: Path, name: str, shared: SharedState) -> SharedPlacementStore:
    """The overrides of a gateway whose data dir is ``tmp_path/name``, loaded as at its start."""
    (tmp_path / name).mkdir(exist_ok=True)
    store = SharedPlacementStore(tmp_path / name / "model-placement.json", shared)
    store.load()
    return store


def on_disk(store: PlacementStore) -> dict[str, object]:
    return dict(json.loads(store.path.read_text()))


async def test_a_write_through_one_data_dir_is_read_and_copied_by_another(tmp_path: Path, shared: SharedState) -> None:
    one, two = replica(tmp_path, "one", shared), replica(tmp_path, "two", shared)
    changes = shared.change_version()
    one.put("a", WHITELIST)
    assert on_disk(one) == {"version": 1, "workers": {"a": WHITELIST.to_json()}}  # the design's format
    assert two.get("a") is None and not two.path.exists()  # not read yet
    await two.pull()
    assert two.get("a") == WHITELIST
    assert two.path.read_bytes() == one.path.read_bytes()  # the copy, byte for byte
    assert two.delete("a") is True
    await one.pull()
    assert one.get("a") is None and on_disk(one) == {"version": 1, "workers": {}}
    assert shared.change_version() == changes  # announcing is the admin frame's (or a hand edit's) job


def test_a_write_starts_from_the_store_not_from_memory(tmp_path: Path, shared: SharedState) -> None:
    one, two = replica(tmp_path, "one", shared), replica(tmp_path, "two", shared)
    one.put("a", WHITELIST)
    two.put("b", WHITELIST)  # knew nothing of "a"
    one.put("c", WHITELIST)  # nor this one of "b"
    assert sorted(one.all()) == ["a", "b", "c"]
    assert sorted(json.loads(one.path.read_text())["workers"]) == ["a", "b", "c"]
    document = shared.document(PLACEMENT)
    assert document is not None and document.text == one.path.read_text()


def test_the_first_start_brings_the_file_in_and_later_replicas_take_the_stores(
    tmp_path: Path, shared: SharedState, caplog: pytest.LogCaptureFixture
) -> None:
    for name, worker in (("one", "a"), ("two", "b")):  # files an earlier version wrote (no gateway record)
        (tmp_path / name).mkdir()
        doc = {"version": 1, "workers": {worker: WHITELIST.to_json()}}
        (tmp_path / name / "model-placement.json").write_text(json.dumps(doc))
    one = replica(tmp_path, "one", shared)
    two = replica(tmp_path, "two", shared)
    assert list(one.all()) == ["a"] and list(two.all()) == ["a"]  # the first replica to start on the store wins
    assert list(json.loads(two.path.read_text())["workers"]) == ["a"]
    assert "is replaced by the shared store's overrides" in caplog.text


def test_a_broken_file_at_the_first_start_refuses_it(tmp_path: Path, shared: SharedState) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "model-placement.json").write_text('{"workers": {"a": {"mode": "sometimes"}}}')
    with pytest.raises(PlacementFileError, match="mode must be"):
        replica(tmp_path, "one", shared)
    assert shared.document(PLACEMENT) is None  # nothing half-brought in


async def test_a_hand_edit_goes_into_the_store_and_reaches_the_others(tmp_path: Path, shared: SharedState) -> None:
    one, two = replica(tmp_path, "one", shared), replica(tmp_path, "two", shared)
    one.put("a", WHITELIST)
    await two.pull()
    changes = shared.change_version()
    edited = '{"version": 1, "workers": {"b": {"mode": "whitelist"}}}\n'
    two.path.write_text(edited)  # by hand, on the second machine
    two.refresh()
    assert list(two.all()) == ["b"] and two.error is None
    assert shared.change_version() == changes + 1  # the others are told
    await one.pull()
    assert list(one.all()) == ["b"] and one.path.read_text() == edited  # copied as written
    one.path.unlink()  # deleting a copy removes no override: it is written again
    one.refresh()
    assert list(one.all()) == ["b"] and one.path.read_text() == edited
    assert shared.change_version() == changes + 1


async def test_a_broken_hand_edit_is_kept_and_refuses_writes_until_fixed(tmp_path: Path, shared: SharedState) -> None:
    one, two = replica(tmp_path, "one", shared), replica(tmp_path, "two", shared)
    one.put("a", WHITELIST)
    await two.pull()
    good = two.path.read_text()
    two.path.write_text('{"version": 1, "workers": {"a": {"mode": "sometimes"}}}')
    two.refresh()
    assert two.error is not None and "mode must be" in two.error
    with pytest.raises(PlacementFileError, match="refusing to overwrite"):
        two.put("b", WHITELIST)
    one.put("c", WHITELIST)  # a change elsewhere still reaches this replica's memory, never its broken file
    await two.pull()
    assert sorted(two.all()) == ["a", "c"] and "sometimes" in two.path.read_text()
    two.path.write_text(good)  # put back as the gateway wrote it
    os.utime(two.path, ns=(1, 1))
    two.refresh()
    assert two.error is None
    await two.pull()
    assert sorted(json.loads(two.path.read_text())["workers"]) == ["a", "c"]


def test_an_edit_made_while_stopped_goes_into_the_store_at_start(tmp_path: Path, shared: SharedState) -> None:
    one = replica(tmp_path, "one", shared)
    one.put("a", WHITELIST)
    one.path.write_text('{"version": 1, "workers": {}}')  # the gateway is "stopped": nothing reads it now
    again = replica(tmp_path, "one", shared)
    assert again.all() == {}
    document = shared.document(PLACEMENT)
    assert document is not None and document.text == '{"version": 1, "workers": {}}'


def test_the_change_version_only_moves_on(shared: SharedState) -> None:
    first = shared.change_version()
    assert [shared.bump_changes(now=1.0) for _ in range(3)] == [first + 1, first + 2, first + 3]
    document = shared.document(CHANGES)
    assert document is not None and document.text is None


# Two writers on two data dirs (two machines) and one store: each waits for the start file, then writes its
# worker's override ROUNDS times, one more denied model each time, and after each write reads its own file: how
# many rules the other writer's worker has there. A lost update shows as that number going down.
WRITER = """
import json, pathlib, sys, time
from turnout.config import load_settings
from turnout.core.placement import PlacementRules
from turnout.state.backup import create_backup
from turnout.state.placement_shared import SharedPlacementStore
from turnout.store.db import Database
from turnout.store.shared_state import SharedState

path, me, other, rounds, start, url = (
    pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
)
db = Database(url)
store = SharedPlacementStore(path, SharedState(db))
store.load()
pathlib.Path(start + "." + me).touch()  # loaded: ready to write
deadline = time.monotonic() + 30
while not pathlib.Path(start).exists() and time.monotonic() < deadline:
    time.sleep(0.001)
seen = []
for i in range(rounds):
    store.put(me, PlacementRules.parse("allow_all", [], [f"{me}-{n}" for n in range(i + 1)]))
    on_disk = json.loads(path.read_text())["workers"]
    seen.append(len(on_disk.get(other, {}).get("denied_models", [])))
db.close()
print(json.dumps(seen))
"""
ROUNDS = 60


def test_writers_on_two_data_dirs_lose_nothing(tmp_path: Path, shared: SharedState) -> None:
    start = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = []
    for me, other in (("a", "b"), ("b", "a")):
        (tmp_path / me).mkdir()
        path = tmp_path / me / "model-placement.json"
        argv = [sys.executable, "-c", WRITER, str(path), me, other, str(ROUNDS), str(start), shared.db.url]
        writers.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    try:
        deadline = time.monotonic() + 60  # both import and load first, then write at the same moment
        while not all((tmp_path / f"go.{me}").exists() for me in "ab") and time.monotonic() < deadline:
            time.sleep(0.01)
        start.touch()
        results = [w.communicate(timeout=180) for w in writers]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
    for writer, (_, err) in zip(writers, results, strict=True):
        assert writer.returncode == 0, err
    seen = [json.loads(out) for out, _ in results]
    for numbers in seen:
        drops = [(i, x, y) for i, (x, y) in enumerate(itertools.pairwise(numbers)) if y < x]
        assert not drops, drops
    final = replica(tmp_path, "final", shared)
    for me in ("a", "b"):
        rules = final.get(me)
        assert rules is not None and [p.text for p in rules.denied] == [f"{me}-{n}" for n in range(ROUNDS)]
    assert max(seen[0]) > 0 and max(seen[1]) > 0  # they did overlap


async def test_a_backup_holds_the_stores_overrides_and_a_restore_gives_them_to_every_replica(
    tmp_path: Path, shared: SharedState
) -> None:
    """Two data dirs on one store: the backup made from the one whose copy lags still holds the store's overrides
    (in the override file's format), and a restore there (`turnout backup restore`, no gateway on that data dir)
    puts them in the store and moves the change version, so the running replica takes them."""
    configs = {}
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        configs[name] = tmp_path / name / "config.json"
        storage = {"data_dir": str(tmp_path / name), "database_url": shared.db.url}
        configs[name].write_text(json.dumps({"storage": storage, "workers": []}))
    one = replica(tmp_path, "one", shared)
    one.put("a", WHITELIST)
    two = load_settings(configs["two"], env={})
    assert not two.placement_file.exists()  # replica two has not copied it (it is not running)
    made = create_backup(two, tmp_path / "backup.zip", now=1_800_000_000.0)
    with zipfile.ZipFile(made.path) as archive:
        backed_up = archive.read("model-placement.json")
    assert backed_up == one.path.read_bytes()
    assert "store/shared_state.jsonl" not in {f.path for f in made.manifest.files}  # the replicas' own

    one.put("b", WHITELIST)  # after the backup
    changes = shared.change_version()
    result = restore_backup(made.path, configs["two"], env={})
    assert any(r.startswith("store (") for r in result.restored)
    document = shared.document(PLACEMENT)
    assert document is not None and document.text is not None and document.text.encode() == backed_up
    assert shared.change_version() > changes  # running replicas re-read
    assert two.placement_file.read_bytes() == backed_up
    await one.pull()
    assert list(one.all()) == ["a"] and one.path.read_bytes() == backed_up
    restored = replica(tmp_path, "two", shared)  # the restored file is a gateway's copy, not a hand edit
    assert list(restored.all()) == ["a"]
    assert shared.document(PLACEMENT) == document
