"""`turnout serve` and the demo model: when it runs and what it writes.

Each gateway runs in a network namespace of its own (tests/support/netns.py), so that what answers at Ollama's
default address (127.0.0.1:11434) is what the test puts there, not another test run on this shared machine. The
demo model is real (SmolLM2-135M on llama.cpp); the banner's curl is run as printed, in the same namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.cli import TURNOUT
from tests.support.netns import WITH_LISTENER, enter, isolated, require
from tests.support.served import Served
from turnout.config import starter_config
from turnout.core.demo import MODEL

READY = "thread: ready"
STARTER = Path("turnout-data") / "config.json"


@pytest.fixture(autouse=True)
def _isolation() -> None:
    require()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("TURNOUT_ADMIN_TOKEN", "TURNOUT_SECRET_KEY")}


@contextmanager
def serve(cwd: Path, *args: str, ollama: bool = False) -> Iterator[Served]:
    """`turnout serve ARGS` in its own network namespace; with ``ollama``, something answers at 127.0.0.1:11434."""
    argv = [*TURNOUT, "serve", *args]
    env = {**_env(), "LISTEN_PORT": "11434"}
    process = Served(isolated(argv, prelude=WITH_LISTENER) if ollama else isolated(argv), cwd, env)
    try:
        yield process
    finally:
        process.kill()


def banner_curl(process: Served) -> str:
    process.wait_for(READY, limit_s=180)
    return process.wait_for("  curl ", limit_s=5).strip()


def run_in(process: Served, command: str, **env: str) -> str:
    """A shell command in the gateway's namespace (as pasted into a second terminal); its output."""
    done = subprocess.run(
        enter(process.proc.pid, ["bash", "-c", command]),
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), **env},
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def streamed_text(sse: str) -> str:
    lines = [line[len("data: ") :] for line in sse.splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", sse[-1000:]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), chunks[-1]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def engine_pids(tmp_path: Path) -> list[int]:
    """Processes whose command line is an engine serving a model under tmp_path's data dir's demo pool."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if (
            b"turnout.runtime.llamacpp_server" in cmdline
            and MODEL.encode() in cmdline
            and cwd.startswith(str(tmp_path))
        ):
            out.append(int(proc.name))
    return out


def test_first_start_with_nothing_else_runs_the_demo_model_until_its_entry_is_removed(tmp_path: Path) -> None:
    with serve(tmp_path) as first:
        curl = banner_curl(first)
        assert "Authorization: Bearer tk_" in curl and '"stream":true' in curl  # the starter key, inline
        answer = streamed_text(run_in(first, curl))
        assert answer.strip(), answer
        assert first.stop(signal.SIGINT) == 0
    said = "\n".join(first.lines)
    assert "nothing answers at http://127.0.0.1:11434" in said
    assert "demo model smollm2-135m on a local llama.cpp engine, CPU, 1 thread" in said
    assert "serving on" in said and "+ the demo model" in said
    assert not engine_pids(tmp_path)  # stopped with the gateway
    written = json.loads((tmp_path / STARTER).read_text())
    assert written == starter_config(demo=True)
    assert written["workers"][-1] == {"name": "demo", "type": "demo"}

    with serve(tmp_path) as later:  # a later start: the entry runs it again; the key is the user's now
        curl = banner_curl(later)
        assert '"Authorization: Bearer $KEY"' in curl
        key = next(line.strip() for line in first.lines if line.strip().startswith("tk_"))
        assert streamed_text(run_in(later, curl, KEY=key)).strip()
        assert later.stop(signal.SIGINT) == 0
    assert not any("nothing answers" in line for line in later.lines)

    listing = subprocess.run([*TURNOUT, "worker", "list"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "demo" in listing.stdout and "llama.cpp" in listing.stdout, listing.stdout
    removed = subprocess.run(
        [*TURNOUT, "worker", "remove", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert removed.returncode == 0, removed.stderr
    assert json.loads((tmp_path / STARTER).read_text()) == starter_config()
    assert (tmp_path / "turnout-data" / "claims" / f"{MODEL}.json").exists()
    with serve(tmp_path) as third:
        third.wait_for("serving on", limit_s=60)
        assert third.stop(signal.SIGINT) == 0
    assert not any("demo model" in line for line in third.lines), third.lines
    assert not (tmp_path / "turnout-data" / "claims" / f"{MODEL}.json").exists()  # the demo's claim goes too


@pytest.mark.parametrize("how", ["ollama answers", "--no-demo"])
def test_no_demo_when_ollama_answers_or_with_no_demo(tmp_path: Path, how: str) -> None:
    args = ["--no-demo"] if how == "--no-demo" else []
    with serve(tmp_path, *args, ollama=how == "ollama answers") as gateway:
        gateway.wait_for("serving on", limit_s=60)
        assert gateway.stop(signal.SIGINT) == 0
    assert json.loads((tmp_path / STARTER).read_text()) == starter_config()
    assert not any("demo model" in line for line in gateway.lines), gateway.lines
    assert not (tmp_path / "turnout-data" / "claims").exists() and not (tmp_path / "turnout-data" / "demo").exists()


def test_demo_flag_runs_it_on_a_users_config_and_writes_nothing_there(tmp_path: Path) -> None:
    config = tmp_path / "mine.json"
    text = json.dumps({"storage": {"data_dir": "state"}, "auth": {"open": True}}, indent=1)
    config.write_text(text)
    needs = subprocess.run(
        [*TURNOUT, "serve", "--config", str(config), "--demo", "--demo-needs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert needs.returncode == 0 and needs.stdout.strip() == "", needs  # all installed here; nothing started
    assert not (tmp_path / "state").exists()
    with serve(tmp_path, "--config", str(config), "--demo", ollama=True) as gateway:  # asked for: Ollama or not
        curl = banner_curl(gateway)
        assert "Authorization" not in curl  # open access: no key to send
        assert streamed_text(run_in(gateway, curl)).strip()
        assert gateway.stop(signal.SIGINT) == 0
    assert config.read_text() == text


def test_demo_with_several_gateway_processes_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "workers": [{"name": "demo", "type": "demo"}]}))
    result = subprocess.run(
        [*TURNOUT, "serve", "--config", str(config), "--workers", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert result.returncode == 2, result
    assert result.stderr.strip().splitlines() == [
        "turnout: the config's demo entry: the demo model runs inside the gateway, which cannot run 2 times: serve "
        "with --workers 1, or without the demo model (--no-demo)"
    ]
    assert not (tmp_path / "state").exists()
