"""The README's quick start, exactly as written, on a fresh copy of the checkout on a machine with nothing else.

"A machine with nothing else": the commands run in a network namespace of their own (tests/support/netns.py), where
no Ollama answers at 127.0.0.1:11434 and port 8080 is free, whatever else runs on this shared machine. The copy
gets its own ./.venv that sees the test environment's packages (a .pth file, as tests/test_scripts_serve.py does),
so pip finds everything installed, the demo's engine and model included, and downloads nothing.

The quick start's `./scripts/serve` line is run as written; the curl its banner prints is pasted (run as printed)
and must stream a real answer; what the README shows of both (its ```text blocks) must match what was printed,
lines marked ``...`` aside; Ctrl-C stops the gateway and its engine. A second start runs no pip and serves the
demo model again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.netns import enter, isolated, require
from tests.support.served import Served
from tests.test_docs_commands import Block, blocks, matches
from tests.test_scripts_serve import INSTALLING

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Quick start"


def quick_start() -> list[Block]:
    """The README's blocks between '## Quick start' and the next '## ' heading."""
    text = (ROOT / "README.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    first_line = text[:start].count("\n") + 1
    last_line = text[:end].count("\n") + 1
    return [b for b in blocks("README.md") if first_line <= b.line <= last_line]


def serve_command(section: list[Block]) -> str:
    """The `./scripts/serve` line of the quick start's first bash block, without its comment."""
    bash = next(b for b in section if b.lang == "bash")
    line = next(ln for ln in bash.text.splitlines() if ln.startswith("./scripts/serve"))
    return line.split("#", 1)[0].strip()


def shown(section: list[Block], marker: str) -> list[str]:
    """The lines of the quick start's ```text block that contains ``marker``."""
    block = next((b for b in section if b.lang == "text" and marker in b.text), None)
    assert block is not None, f"the README's quick start shows no output with {marker!r}"
    return block.text.splitlines()


@pytest.fixture
def fresh_checkout(tmp_path: Path) -> Path:
    require()
    path = tmp_path / "turnout"
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


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_") and k != "PYTHONPATH"}


def test_the_quick_start_as_written_streams_an_answer_from_the_demo_model(fresh_checkout: Path) -> None:
    section = quick_start()
    command = serve_command(section)
    assert command == "./scripts/serve", command
    serve = Served(isolated(["bash", "-c", command]), fresh_checkout, _env())
    try:
        serve.wait_for("thread: ready", limit_s=300)
        curl = serve.wait_for("  curl ", limit_s=5).strip()
        pasted = subprocess.run(
            enter(serve.proc.pid, ["bash", "-c", curl]), capture_output=True, text=True, timeout=120, env=_env()
        )
        assert serve.stop(signal.SIGINT) == 0
    finally:
        serve.kill()
    assert pasted.returncode == 0, pasted.stderr
    printed = serve.lines[: serve.lines.index(f"  {curl}") + 1]
    expected = shown(section, "serving on")
    assert matches(expected, printed), "the README's quick start output is not what ./scripts/serve printed:\n" + (
        "\n".join(printed)
    )
    answer = pasted.stdout.rstrip("\n").splitlines()  # an event ends with a blank line, the last one too
    assert matches(shown(section, "data: [DONE]"), answer), "the README's answer is not what the curl printed:\n" + (
        "\n".join([*answer[:6], "...", *answer[-4:]])
    )
    chunks = [json.loads(line[6:]) for line in answer if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert re.search(r"[A-Za-z]{2,}", text), text  # words, from a real model
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "turnout: stopped" in serve.lines
    assert not _engines(fresh_checkout)

    again = Served(isolated(["bash", "-c", command]), fresh_checkout, _env())  # a later start
    try:
        ready = again.wait_for("thread: ready", limit_s=120)
        assert again.stop(signal.SIGINT) == 0
    finally:
        again.kill()
    assert not any(INSTALLING in line for line in again.lines), again.lines
    seconds = float(re.search(r"ready ([0-9.]+) s after start", ready).group(1))  # type: ignore[union-attr]
    print(f"later start: the demo model answered {seconds} s after the start")


def _engines(checkout: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cwd = os.readlink(proc / "cwd") if proc.name.isdigit() else ""
            cmdline = (proc / "cmdline").read_bytes() if cwd.startswith(str(checkout)) else b""
        except OSError:
            continue
        if b"turnout.runtime.llamacpp_server" in cmdline:
            found.append(int(proc.name))
    return found
