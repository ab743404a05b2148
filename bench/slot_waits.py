"""Why interactive turns waited for an engine's slot in a `bench/batch_fleet.py` run: its engines' logs against its
gateways' access lines.

llama.cpp's server logs each task's start on a slot (``launch_slot_``), its timings when it ran to its end, and its
release, in seconds since the engine started; the gateway's access line of each interactive request has its end
(wall clock), its duration and its worker. Each engine's clock is aligned with the gateway's by the most common gap
between an interactive request's end and a task's release there. Then, per interactive turn: its **slot wait**
(from the request's arrival to its task's start on the engine) and what held the slot before it: a task stopped
for it (a batch line), or one that ran to its end (a batch line, or another interactive turn: the router expected
that engine to be quicker than stopping a line elsewhere).

    python bench/slot_waits.py /tmp/turnout-batch-fleet-XXXX     # the directory the bench printed
"""

from __future__ import annotations

import collections
import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.prefix import pct

CLOCK = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
LAUNCH = re.compile(r"launch_slot_: id\s+\d+ \| task (\d+)")
EVAL = re.compile(r"task (\d+) \|\s+eval time =")
RELEASE = re.compile(r"release: id\s+\d+ \| task (\d+) \| stop processing")
ACCESS = re.compile(r'^(\S+ \S+) INFO turnout\.access: .*" 200 \d+ ([\d.]+)s .*worker=(\S+) .*priority=interactive')
SLOW_S = 0.2


def engine_tasks(path: Path) -> list[dict[str, Any]]:
    """The tasks of one engine's log, in the order they started: start, release, whether they ran to their end."""
    tasks: dict[str, dict[str, Any]] = {}
    for line in path.read_text(errors="replace").splitlines():
        clock = CLOCK.match(line)
        if clock is None:
            continue
        at = int(clock[1]) * 60 + int(clock[2]) + int(clock[3]) / 1e3 + int(clock[4]) / 1e6
        if m := LAUNCH.search(line):
            tasks[m[1]] = {"start": at, "ended": False}
        elif (m := EVAL.search(line)) and m[1] in tasks:
            tasks[m[1]]["ended"] = True
        elif (m := RELEASE.search(line)) and m[1] in tasks:
            tasks[m[1]]["release"] = at
    return sorted((t for t in tasks.values() if "release" in t), key=lambda t: t["start"])


def turns_of(run: Path) -> list[dict[str, Any]]:
    """Every interactive turn of the run's gateways, with its slot wait and what held the slot before it."""
    turns = []
    for log in sorted(run.glob("gw-*/gateway.log")):
        for line in log.read_text().splitlines():
            if m := ACCESS.match(line):
                end = dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                turns.append({"end": end, "arrived": end - float(m[2]), "worker": m[3]})
    for n, path in enumerate(sorted(run.glob("engine*.log"))):
        tasks, mine = engine_tasks(path), [t for t in turns if t["worker"] == f"e{n}"]
        gaps = collections.Counter(round(t["end"] - task["release"], 2) for t in mine for task in tasks)
        if not gaps:
            continue
        offset = max(gaps, key=lambda g: gaps[g] + gaps[round(g - 0.01, 2)] + gaps[round(g + 0.01, 2)])
        for turn in mine:
            task = min(tasks, key=lambda t: abs(t["release"] + offset - turn["end"]))
            if abs(task["release"] + offset - turn["end"]) > 0.05:
                continue
            task["interactive"] = True
            turn["slot_wait"] = task["start"] + offset - turn["arrived"]
            i = tasks.index(task)
            if i:
                turn["before"] = tasks[i - 1]
                turn["released_after_arrival"] = tasks[i - 1]["release"] + offset - turn["arrived"]
    return [t for t in turns if "slot_wait" in t]


def held_by(turn: dict[str, Any]) -> str:
    before = turn.get("before")
    if before is None:
        return "nothing before it"
    if turn["released_after_arrival"] < 0:
        return "the slot was free when it came"
    if not before["ended"]:
        return "a task stopped for it"
    return (
        "an interactive turn that ran to its end" if before.get("interactive") else "a batch line that ran to its end"
    )


def main(run: Path) -> None:
    turns = turns_of(run)
    if not turns:
        sys.exit(f"no interactive turn matched an engine task in {run}")
    waits = [t["slot_wait"] for t in turns]
    p50, p90 = pct(waits, 0.5), pct(waits, 0.9)
    print(f"{len(turns)} interactive turns matched: slot wait p50 {p50:.3f} s, p90 {p90:.3f} s")
    slow = collections.Counter(held_by(t) for t in turns if t["slot_wait"] > SLOW_S)
    print(f"waited over {SLOW_S} s: {sum(slow.values())}, behind: {dict(slow)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
