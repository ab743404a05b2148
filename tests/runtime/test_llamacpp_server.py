"""The llama.cpp engine process (turnout.runtime.llamacpp_server): llama.cpp's own server from the xllamacpp wheel,
set by llama-server's flags, stopped cleanly by SIGTERM; and the flag table against the real binding."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import xllamacpp

from tests.conftest import free_port
from turnout.core.llamacpp_flags import FLAGS, EnumValue, settings
from turnout.runtime.llamacpp_server import build_params

SAMPLES = {  # a value each kind reads
    "int": "4",
    "float": "0.5",
    "str": "x",
    "file": "",
    "host": "127.0.0.1",
    "names": "a,b",
    "list": "k1,k2",
    "one-list": "stop",
    "slots": "2",
    "threads": "1",
    "idle-seconds": "60",
    "gpu-layers": "all",
    "on-off": "on",
    "flash-attn": "auto",
    "reasoning": "off",
    "sampling": "1",
    "lora": "a.gguf",
    "lora-scaled": "a.gguf:0.5",
}


def _sample(kind: str, choices: Any) -> str | None:
    if choices:
        return str(next(iter(choices)))
    return SAMPLES.get(kind)


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.kind != "file"], ids=lambda f: f.name)
def test_every_flag_sets_a_field_the_binding_has(flag: Any) -> None:
    """Each flag of the table, with a value it reads, fills a real ``xllamacpp.CommonParams`` (a renamed field or
    enum in a new xllamacpp fails here, not in a claim's engine)."""
    read = settings([(flag.name, _sample(flag.kind, flag.choices))])
    params = build_params(xllamacpp, read)
    for field, value in read.assignments:
        target: Any = params
        for part in field.split("."):
            target = getattr(target, part)
        if isinstance(value, EnumValue) and field != "sampling.user_sampling_config":
            assert target == getattr(getattr(xllamacpp, value.enum), value.member), field
        elif field == "lora_adapters":
            assert [(a.path, a.scale) for a in target] == value
        elif field not in ("sampling.user_sampling_config", "default_template_kwargs", "cpuparams.n_threads"):
            assert target == pytest.approx(value) if isinstance(value, float) else target == value, field


def test_a_flag_it_does_not_take_stops_it_before_anything_loads(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "turnout.runtime.llamacpp_server", "--model", str(tmp_path / "none.gguf"), "--mlock"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--mlock" in done.stderr and "no field for it" in done.stderr
    assert time.monotonic() - started < 30  # no model was loaded (there is none)
    missing = subprocess.run(
        [sys.executable, "-m", "turnout.runtime.llamacpp_server", "--model", str(tmp_path / "none.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "llama.cpp did not start" in missing.stderr


def test_it_serves_as_set_and_stops_cleanly_on_sigterm(tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "engine.log").open("wb")
    argv = [sys.executable, "-m", "turnout.runtime.llamacpp_server", "--model", str(tiny_model), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--alias", "tiny", "-c", "1024", "-np", "2", "--threads", "1", "--metrics"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "engine.log").read_text()
                time.sleep(0.1)
        with urllib.request.urlopen(f"{url}/props", timeout=5) as r:
            props = json.load(r)
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 512  # 1024 / 2
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
            assert [m["id"] for m in json.load(r)["data"]] == ["tiny"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            assert b"llamacpp:requests_processing" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # the server stopped, the model freed, the process ended on its own
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
