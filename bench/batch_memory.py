"""What a batch input file costs in memory as its lines are read (``turnout.core.batches.parse_batch_file``, which an
upload, a batch's creation and its runner each call), side by side for this tree and ``--src`` trees.

For each tree a fresh Python process (``PYTHONPATH`` the tree) builds a file of ``--lines`` chat lines of about
``--line-bytes`` bytes each, then reads it under ``tracemalloc``: the memory the parsed lines keep, and the peak while
reading. The runner keeps the parsed lines for the whole batch, so what they keep is what a running batch holds.

    python bench/batch_memory.py                           # 50,000 lines of about 0.5 KB: a 25 MB file
    python bench/batch_memory.py --src /tmp/base/src       # and an earlier tree
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, tracemalloc
from turnout.core.batches import parse_batch_file
lines, size = int(sys.argv[1]), int(sys.argv[2])
pad = "x" * max(0, size - 200)
data = b"".join(
    json.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"{pad} {n}"}], "max_tokens": 8}}
    ).encode() + b"\\n"
    for n in range(lines)
)
tracemalloc.start()
parsed = parse_batch_file(data, 10**9)
kept, peak = tracemalloc.get_traced_memory()
print(json.dumps({"file": len(data), "kept": kept, "peak": peak, "lines": len(parsed)}))
"""


def measure(src: Path, lines: int, size: int) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(lines), str(size)], env=env, capture_output=True, text=True, check=True
    )
    found: dict[str, int] = json.loads(out.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", default=[], help="another source tree (repeatable)")
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--line-bytes", type=int, default=500)
    args = parser.parse_args()
    mb = 2**20
    print("| tree | lines | file MB | kept by the parsed lines MB | peak while reading MB |")
    print("|---|---:|---:|---:|---:|")
    for tree in [ROOT / "src", *(Path(s).resolve() for s in args.src)]:
        got = measure(tree, args.lines, args.line_bytes)
        print(f"| {tree} | {got['lines']} | {got['file'] / mb:.1f} | {got['kept'] / mb:.1f} | {got['peak'] / mb:.1f} |")


if __name__ == "__main__":
    main()
